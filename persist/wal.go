package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// WAL file format, version 2; see doc.go. Version 1 is version 2 without
// appends: this build writes version 2 and reads both.
const (
	walMagic       = "SLUICWAL"
	walVersion     = uint32(2)
	walMinVersion  = uint32(1)
	walAppendSince = uint32(2) // the first version with walOpAppend
	walHeaderLen   = 16        // magic, version, reserved

	frameHeaderLen = 8  // body length, CRC-32C of the body
	frameMinBody   = 12 // sequence number, record count
	// maxFrameBody bounds a frame's body: a length beyond it cannot have
	// been written and marks a torn or corrupt frame.
	maxFrameBody = 1<<31 - 1

	walOpPut    = byte(1)
	walOpDelete = byte(2)
	walOpAppend = byte(3)
)

// keyWAL, in the meta bucket, holds the WAL generation and the sequence
// number of the last frame whose records a checkpoint wrote into the file:
// [8-byte big-endian generation][8-byte big-endian sequence number].
var keyWAL = []byte("wal")

// keyPartial, in the meta bucket, marks a checkpoint written in several
// transactions and not finished: [8-byte big-endian generation][key]. The
// data file holds the final value, as of that WAL generation, of every key
// up to and including key (in bbolt's byte order); the replay skips the
// records of those keys in the WAL files up to that generation. The
// transaction that records the checkpoint's WAL position deletes it.
var keyPartial = []byte("partial")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// walHeader is the first walHeaderLen bytes of every WAL file.
var walHeader = func() []byte {
	b := append([]byte(walMagic), binary.LittleEndian.AppendUint32(nil, walVersion)...)
	return binary.LittleEndian.AppendUint32(b, 0)
}()

// walName returns the path of WAL generation gen of the data file at path.
func walName(path string, gen uint64) string {
	return fmt.Sprintf("%s.wal.%08d", path, gen)
}

// walFile is a WAL file found next to the data file.
type walFile struct {
	gen  uint64
	path string
}

// listWALs returns the WAL files of the data file at path, by generation.
func listWALs(path string) ([]walFile, error) {
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	prefix := filepath.Base(path) + ".wal."
	var out []walFile
	for _, e := range ents {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || rest == "" || strings.Trim(rest, "0123456789") != "" {
			continue
		}
		gen, err := strconv.ParseUint(rest, 10, 64)
		if err != nil || gen == 0 {
			continue
		}
		out = append(out, walFile{gen: gen, path: filepath.Join(filepath.Dir(path), name)})
	}
	slices.SortFunc(out, func(a, b walFile) int {
		switch {
		case a.gen < b.gen:
			return -1
		case a.gen > b.gen:
			return 1
		}
		return 0
	})
	return out, nil
}

// createWAL creates WAL generation gen, with its header, and in ModeFsync
// makes the header and the file's directory entry durable, so that frames
// fdatasync'ed into it later survive a power loss.
func createWAL(path string, gen uint64, durable bool) (*os.File, error) {
	name := walName(path, gen)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(walHeader)
	if err == nil && durable {
		err = f.Sync()
		if err == nil {
			err = syncDir(filepath.Dir(path))
		}
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(name)
		return nil, err
	}
	return f, nil
}

// frameEncoder builds one frame in a buffer it reuses.
type frameEncoder struct {
	buf []byte
	n   uint32
}

// begin starts a frame with sequence number seq.
func (e *frameEncoder) begin(seq uint64) {
	e.buf = append(e.buf[:0], make([]byte, frameHeaderLen)...)
	e.buf = binary.LittleEndian.AppendUint64(e.buf, seq)
	e.buf = binary.LittleEndian.AppendUint32(e.buf, 0) // count, set by end
	e.n = 0
}

// record encodes r: a deletion (nil Value), an append or a put.
func (e *frameEncoder) record(r *Record) {
	switch {
	case r.Value == nil:
		e.del(r.Key)
	case r.Append:
		e.value(walOpAppend, r.Key, r.Deadline, r.Value) // a put's layout, another byte
	default:
		e.value(walOpPut, r.Key, r.Deadline, r.Value)
	}
}

// value encodes a record with a value: a put or an append.
func (e *frameEncoder) value(op byte, key string, deadline int64, value []byte) {
	e.buf = append(e.buf, op)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(key)))
	e.buf = append(e.buf, key...)
	e.buf = binary.LittleEndian.AppendUint64(e.buf, uint64(deadline))
	e.buf = binary.AppendUvarint(e.buf, uint64(len(value)))
	e.buf = append(e.buf, value...)
	e.n++
}

func (e *frameEncoder) del(key string) {
	e.buf = append(e.buf, walOpDelete)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(key)))
	e.buf = append(e.buf, key...)
	e.n++
}

// end fills the frame's length, count and checksum and returns it, or an
// error if the frame is too large to be framed.
func (e *frameEncoder) end() ([]byte, error) {
	body := len(e.buf) - frameHeaderLen
	if body > maxFrameBody {
		return nil, fmt.Errorf("frame of %d bytes is longer than %d", body, maxFrameBody)
	}
	binary.LittleEndian.PutUint32(e.buf[frameHeaderLen+8:], e.n)
	binary.LittleEndian.PutUint32(e.buf[0:], uint32(body))
	binary.LittleEndian.PutUint32(e.buf[4:], crc32.Checksum(e.buf[frameHeaderLen:], castagnoli))
	return e.buf, nil
}

// reset drops a buffer grown past max bytes.
func (e *frameEncoder) reset(max int) {
	if cap(e.buf) > max {
		e.buf = nil
	}
}

// walRecord is one record of a frame, as decoded; its slices point into the
// file's bytes.
type walRecord struct {
	del      bool
	app      bool // an append; else, unless del, a put
	key      []byte
	deadline int64
	value    []byte
}

// walScan is what decodeWAL found in one file.
type walScan struct {
	frames  int
	records int
	lastSeq uint64 // of the last complete frame; 0 if none
	torn    int    // bytes of an incomplete final frame (a torn write), ignored
	// damaged is the size of a final frame that is complete but fails its
	// checksum: written in full, so acknowledged, and damaged since.
	damaged int
}

// errWALEmpty is not an error: the file is shorter than its header and holds
// a prefix of it (its creation was interrupted).
var errWALEmpty = errors.New("empty")

// callbackError is an error of decodeWAL's callback, which decodeWAL
// returns as it is: not a sign of a bad file.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// walReadError is an I/O error of decodeWAL, not a sign of a bad file.
type walReadError struct{ err error }

func (e walReadError) Error() string { return e.err.Error() }

// decodeWAL checks the header of a WAL file of size bytes, read from r, and
// calls fn for every record of every complete frame, in order. It holds one
// frame in memory at a time; a record's slices are valid only during fn.
// wantSeq is the sequence number the first frame must have; each next frame
// must have the next one.
//
// The last frame may be torn: shorter than its length says or with an
// invalid length, and nothing valid after it. It was never acknowledged;
// decodeWAL ignores it and reports its size (walScan.torn). A last frame
// that is complete but fails its checksum was written in full, so
// acknowledged, and damaged since: decodeWAL reports it apart
// (walScan.damaged) for the caller to refuse or accept the loss. A frame that
// fails its checksum while a later frame is intact, a frame whose records
// do not parse, or a sequence number out of order is an error: a message
// for formatError. A read that fails is a walReadError; an error of fn is
// returned as it is.
func decodeWAL(r io.ReaderAt, size int64, wantSeq uint64, fn func(walRecord) error) (walScan, error) {
	var sc walScan
	read := func(b []byte, off int64) error {
		if _, err := r.ReadAt(b, off); err != nil {
			return walReadError{err}
		}
		return nil
	}
	hdr := make([]byte, min(size, walHeaderLen))
	if err := read(hdr, 0); err != nil {
		return sc, err
	}
	if len(hdr) < walHeaderLen {
		if bytes.HasPrefix(walHeader, hdr) || allZero(hdr) {
			sc.torn = len(hdr)
			return sc, errWALEmpty
		}
		return sc, fmt.Errorf("%d bytes, not a Sluice WAL file", len(hdr))
	}
	if string(hdr[:len(walMagic)]) != walMagic {
		return sc, fmt.Errorf("not a Sluice WAL file (magic %q)", hdr[:len(walMagic)])
	}
	version := binary.LittleEndian.Uint32(hdr[len(walMagic):])
	if version < walMinVersion || version > walVersion {
		return sc, fmt.Errorf("WAL format version %d; this build reads versions %d to %d only (run the sluice release that wrote it)", version, walMinVersion, walVersion)
	}
	var buf []byte
	for off := int64(walHeaderLen); off < size; {
		// Read the frame its header announces, if the file holds it.
		var body []byte
		if size-off >= frameHeaderLen {
			buf = slices.Grow(buf[:0], frameHeaderLen)[:frameHeaderLen]
			if err := read(buf, off); err != nil {
				return sc, err
			}
			if n := int64(binary.LittleEndian.Uint32(buf)); n >= frameMinBody && n <= maxFrameBody && off+frameHeaderLen+n <= size {
				buf = slices.Grow(buf, int(n))[:frameHeaderLen+n]
				if err := read(buf[frameHeaderLen:], off+frameHeaderLen); err != nil {
					return sc, err
				}
				body, _ = frameAt(buf, 0)
			}
		}
		if body == nil {
			// Not an intact frame: look at the rest of the file, in
			// memory (a torn frame is short; a longer rest means trouble).
			rest := make([]byte, size-off)
			if err := read(rest, off); err != nil {
				return sc, err
			}
			_, why := frameAt(rest, 0)
			if tornTail(rest, 0, wantSeq) {
				if why == "checksum mismatch" {
					sc.damaged = len(rest)
				} else {
					sc.torn = len(rest)
				}
				return sc, nil
			}
			return sc, fmt.Errorf("frame %d at offset %d: %s, and an intact frame follows it: the file is corrupt in its middle", sc.frames+1, off, why)
		}
		seq := binary.LittleEndian.Uint64(body)
		if seq != wantSeq {
			return sc, fmt.Errorf("frame %d at offset %d has sequence number %d; want %d (frames are missing)", sc.frames+1, off, seq, wantSeq)
		}
		n, err := decodeFrame(body, version, fn)
		var cerr callbackError
		if errors.As(err, &cerr) {
			return sc, cerr.err
		}
		if err != nil {
			return sc, fmt.Errorf("frame %d at offset %d: %v", sc.frames+1, off, err)
		}
		sc.frames++
		sc.records += n
		sc.lastSeq = seq
		wantSeq = seq + 1
		off += frameHeaderLen + int64(len(body))
	}
	return sc, nil
}

// frameAt returns the body of the intact frame at off, or nil and why not.
func frameAt(data []byte, off int) (body []byte, why string) {
	if len(data)-off < frameHeaderLen {
		return nil, "incomplete header"
	}
	n := int(binary.LittleEndian.Uint32(data[off:]))
	end := off + frameHeaderLen + n
	switch {
	case n < frameMinBody || n > maxFrameBody:
		return nil, fmt.Sprintf("invalid length %d", n)
	case end > len(data):
		return nil, fmt.Sprintf("length %d past the end of the file", n)
	}
	body = data[off+frameHeaderLen : end]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[off+4:]) {
		return nil, "checksum mismatch"
	}
	return body, ""
}

// tornTail reports whether the unreadable frame at off is the file's torn
// final frame: no intact frame with one of the next few sequence numbers
// starts after it. (A frame is only ever appended after the previous one was
// written in full, so an intact later frame means the damage is not a torn
// write but corruption of acknowledged data.)
func tornTail(data []byte, off int, wantSeq uint64) bool {
	for d := uint64(0); d < 8; d++ {
		pat := binary.LittleEndian.AppendUint64(nil, wantSeq+d)
		for from := off + 1; from < len(data); {
			i := bytes.Index(data[from:], pat)
			if i < 0 {
				break
			}
			if p := from + i - frameHeaderLen; p > off {
				if body, _ := frameAt(data, p); body != nil {
					return false
				}
			}
			from += i + 1
		}
	}
	return true
}

// decodeFrame calls fn for each record of an intact frame's body, from a
// file of WAL format version.
func decodeFrame(body []byte, version uint32, fn func(walRecord) error) (int, error) {
	count := int(binary.LittleEndian.Uint32(body[8:]))
	p := body[frameMinBody:]
	for i := range count {
		var r walRecord
		if len(p) < 1 {
			return i, fmt.Errorf("record %d of %d: missing", i+1, count)
		}
		op := p[0]
		p = p[1:]
		klen, n := binary.Uvarint(p)
		if n <= 0 || klen == 0 || klen > MaxKeyLen || uint64(len(p)-n) < klen {
			return i, fmt.Errorf("record %d of %d: bad key length", i+1, count)
		}
		r.key = p[n : n+int(klen)]
		p = p[n+int(klen):]
		switch op {
		case walOpDelete:
			r.del = true
		case walOpPut, walOpAppend:
			if op == walOpAppend && version < walAppendSince {
				return i, fmt.Errorf("record %d of %d (key %q): an append, in a file of WAL format version %d, which has none", i+1, count, r.key, version)
			}
			r.app = op == walOpAppend
			if len(p) < 8 {
				return i, fmt.Errorf("record %d of %d (key %q): missing deadline", i+1, count, r.key)
			}
			r.deadline = int64(binary.LittleEndian.Uint64(p))
			p = p[8:]
			vlen, n := binary.Uvarint(p)
			if n <= 0 || vlen > MaxValueLen || uint64(len(p)-n) < vlen {
				return i, fmt.Errorf("record %d of %d (key %q): bad value length", i+1, count, r.key)
			}
			if r.deadline <= 0 {
				return i, fmt.Errorf("record %d of %d (key %q): deadline %d", i+1, count, r.key, r.deadline)
			}
			if r.app && vlen == 0 {
				return i, fmt.Errorf("record %d of %d (key %q): an append of nothing", i+1, count, r.key)
			}
			r.value = p[n : n+int(vlen) : n+int(vlen)]
			p = p[n+int(vlen):]
		default:
			return i, fmt.Errorf("record %d of %d: unknown operation %d", i+1, count, op)
		}
		if err := fn(r); err != nil {
			return i, callbackError{err}
		}
	}
	if len(p) != 0 {
		return count, fmt.Errorf("%d bytes after its %d records", len(p), count)
	}
	return count, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// removeWAL removes a WAL file; a file already gone is not an error.
func removeWAL(name string) error {
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
