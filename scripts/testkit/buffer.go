package testkit

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that many goroutines may write to and read
// from at once: the log of a node or a store, the output of a command. Its
// zero value is an empty buffer ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Len returns the number of bytes written so far.
func (s *SyncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// Tail keeps the last lines written to it, for a test to print when it
// fails: the log of an in-process node, which a passing test never shows.
// Many goroutines may write to it at once; a write is taken as whole
// lines (slog writes one record per call).
type Tail struct {
	mu    sync.Mutex
	lines []string
	next  int // where the next line goes once lines is full
	full  bool
}

// NewTail returns a Tail that keeps the last n lines.
func NewTail(n int) *Tail { return &Tail{lines: make([]string, n)} }

// Write records each line of p.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		t.lines[t.next] = string(l)
		t.next = (t.next + 1) % len(t.lines)
		t.full = t.full || t.next == 0
	}
	return len(p), nil
}

// String returns the lines kept, oldest first, each ending in a newline.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b bytes.Buffer
	if t.full {
		for _, l := range t.lines[t.next:] {
			b.WriteString(l + "\n")
		}
	}
	for _, l := range t.lines[:t.next] {
		b.WriteString(l + "\n")
	}
	return b.String()
}
