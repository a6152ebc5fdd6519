// Package chromium drives a headless Chromium for the web UI's tests: it
// starts the browser with the DevTools protocol on a pipe
// (--remote-debugging-pipe: commands on the child's file descriptor 3,
// answers on 4, each JSON message ended by a NUL byte), opens pages, runs
// JavaScript in them to read the rendered DOM, and takes screenshots.
//
// It speaks the few protocol methods it needs (Target, Page, Runtime,
// Emulation) and nothing else, with no dependency: no websocket, no port.
// Every call takes a context; Close ends the browser and waits for it.
package chromium

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// Find returns the Chromium binary to use: $SLUICE_CHROMIUM if set, else
// chromium (Debian's package) or chromium-browser on PATH; "" when there is
// none.
func Find() string {
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser is a running headless Chromium.
type Browser struct {
	cmd    *exec.Cmd
	in     io.WriteCloser // commands, the child's fd 3
	stderr bytes.Buffer   // the child's, for error messages

	mu      sync.Mutex
	nextID  int64
	pending map[int64]chan message
	readErr error

	readDone chan struct{}
	waitDone chan struct{}
	waitErr  error
}

// message is a DevTools protocol message: an answer (ID set) or an event.
type message struct {
	ID        int64           `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    any             `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// Start runs the Chromium at path, headless, with a fresh profile in
// profileDir (which the caller removes).
func Start(path, profileDir string) (*Browser, error) {
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		cmdR.Close()
		cmdW.Close()
		return nil, err
	}
	b := &Browser{in: cmdW, pending: make(map[int64]chan message), readDone: make(chan struct{}), waitDone: make(chan struct{})}
	b.cmd = exec.Command(path,
		"--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--disable-background-networking", "--disable-sync", "--metrics-recording-only",
		"--hide-scrollbars", "--mute-audio", "--font-render-hinting=none",
		"--user-data-dir="+profileDir, "--remote-debugging-pipe", "about:blank")
	b.cmd.ExtraFiles = []*os.File{cmdR, outW} // fds 3 and 4
	b.cmd.Stderr = &lockedWriter{w: &b.stderr, mu: &b.mu}
	if err := b.cmd.Start(); err != nil {
		cmdR.Close()
		cmdW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("chromium: start %s: %w", path, err)
	}
	cmdR.Close()
	outW.Close()
	go b.read(outR)
	go func() {
		b.waitErr = b.cmd.Wait()
		close(b.waitDone)
	}()
	return b, nil
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// read delivers answers to their callers until the pipe closes.
func (b *Browser) read(r io.ReadCloser) {
	defer close(b.readDone)
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		raw, err := br.ReadBytes(0)
		if err != nil {
			b.fail(fmt.Errorf("chromium: the browser closed its protocol pipe (%v); stderr: %s", err, b.stderrTail()))
			return
		}
		var m message
		if err := json.Unmarshal(raw[:len(raw)-1], &m); err != nil {
			b.fail(fmt.Errorf("chromium: unreadable protocol message: %v", err))
			return
		}
		if m.ID == 0 {
			continue // an event: nothing here waits for events
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// fail ends every call waiting for an answer with err.
func (b *Browser) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.readErr = err
	for id, ch := range b.pending {
		close(ch)
		delete(b.pending, id)
	}
}

func (b *Browser) stderrTail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stderr.Bytes()
	return string(s[max(len(s)-2000, 0):])
}

// call sends method with params (in session, if not empty) and decodes
// the result into out (if not nil).
func (b *Browser) call(ctx context.Context, session, method string, params, out any) error {
	b.mu.Lock()
	if b.readErr != nil {
		b.mu.Unlock()
		return b.readErr
	}
	b.nextID++
	id := b.nextID
	ch := make(chan message, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	raw, err := json.Marshal(message{ID: id, Method: method, Params: params, SessionID: session})
	if err != nil {
		return err
	}
	if _, err := b.in.Write(append(raw, 0)); err != nil {
		return fmt.Errorf("chromium: %s: %w", method, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.readErr
		}
		if m.Error != nil {
			return fmt.Errorf("chromium: %s: %s (%d)", method, m.Error.Message, m.Error.Code)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		return fmt.Errorf("chromium: %s: %w", method, ctx.Err())
	}
}

// Close ends the browser and waits for it to exit (killing it after 5 s).
func (b *Browser) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b.call(ctx, "", "Browser.close", nil, nil) // it may exit before answering
	b.in.Close()
	select {
	case <-b.waitDone:
	case <-time.After(5 * time.Second):
		b.cmd.Process.Kill()
		<-b.waitDone
	}
	<-b.readDone
	var exit *exec.ExitError
	if b.waitErr != nil && !errors.As(b.waitErr, &exit) {
		return b.waitErr
	}
	return nil
}

// Page is one tab.
type Page struct {
	b       *Browser
	session string
}

// NewPage opens a tab of width × height CSS pixels.
func (b *Browser) NewPage(ctx context.Context, width, height int) (*Page, error) {
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		return nil, err
	}
	var att struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att); err != nil {
		return nil, err
	}
	p := &Page{b: b, session: att.SessionID}
	if err := p.call(ctx, "Page.enable", nil, nil); err != nil {
		return nil, err
	}
	return p, p.Resize(ctx, width, height)
}

func (p *Page) call(ctx context.Context, method string, params, out any) error {
	return p.b.call(ctx, p.session, method, params, out)
}

// Resize sets the viewport to width × height CSS pixels.
func (p *Page) Resize(ctx context.Context, width, height int) error {
	return p.call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{
		"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false,
	}, nil)
}

// Navigate loads url and waits until the new document has loaded.
func (p *Page) Navigate(ctx context.Context, url string) error {
	// The old document carries a mark the new one lacks.
	if err := p.Eval(ctx, "window.sluiceOldDocument = true", nil); err != nil {
		return err
	}
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	if err := p.call(ctx, "Page.navigate", map[string]any{"url": url}, &nav); err != nil {
		return err
	}
	if nav.ErrorText != "" {
		return fmt.Errorf("chromium: navigate to %s: %s", url, nav.ErrorText)
	}
	return p.WaitFor(ctx, `!window.sluiceOldDocument && document.readyState === "complete"`)
}

// Eval runs the JavaScript expression expr in the page (awaiting it if it
// is a promise) and decodes its value, as JSON, into out (if not nil).
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception *struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.call(ctx, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r)
	if err != nil {
		return err
	}
	if e := r.ExceptionDetails; e != nil {
		msg := e.Text
		if e.Exception != nil {
			msg = e.Exception.Description
		}
		return fmt.Errorf("chromium: %s: %s", expr, msg)
	}
	if out == nil || r.Result.Value == nil {
		return nil
	}
	return json.Unmarshal(r.Result.Value, out)
}

// WaitFor polls expr every 20 ms until it is true, or ctx ends (then it
// fails, saying what it waited for).
func (p *Page) WaitFor(ctx context.Context, expr string) error {
	for {
		var ok bool
		err := p.Eval(ctx, "!!("+expr+")", &ok)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("chromium: waiting for %s: %w", expr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Screenshot returns a PNG of the whole page, as tall as its content.
func (p *Page) Screenshot(ctx context.Context) ([]byte, error) {
	var size struct{ W, H float64 }
	if err := p.Eval(ctx, `({W: document.documentElement.clientWidth, H: document.documentElement.scrollHeight})`, &size); err != nil {
		return nil, err
	}
	var shot struct {
		Data string `json:"data"`
	}
	err := p.call(ctx, "Page.captureScreenshot", map[string]any{
		"format": "png", "captureBeyondViewport": true,
		"clip": map[string]any{"x": 0, "y": 0, "width": size.W, "height": size.H, "scale": 1},
	}, &shot)
	if err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(shot.Data)
}
