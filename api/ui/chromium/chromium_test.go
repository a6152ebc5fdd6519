package chromium

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// TestPage: a page served locally is loaded, its script runs, the rendered
// DOM is read back, and a screenshot is a PNG. Without Chromium it skips,
// or fails with CI set (.ci/run installs it).
func TestPage(t *testing.T) {
	path := Find()
	if path == "" {
		const msg = "no Chromium (install Debian's chromium, or set SLUICE_CHROMIUM)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte(`<!doctype html><body><ul id="l"></ul><script>
			for (const x of ["a", "b"]) { const li = document.createElement("li"); li.textContent = x; document.getElementById("l").append(li); }
			setTimeout(() => { document.body.dataset.ready = "1"; }, 50);
		</script></body>`))
	}))
	defer srv.Close()
	b, err := Start(path, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := b.NewPage(ctx, 400, 300)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Navigate(ctx, srv.URL+"/page"); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitFor(ctx, `document.body.dataset.ready === "1"`); err != nil {
		t.Fatal(err)
	}
	var items []string
	if err := p.Eval(ctx, `[...document.querySelectorAll("#l li")].map((li) => li.textContent)`, &items); err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || items[0] != "a" || items[1] != "b" {
		t.Errorf("list items = %q; want [a b]", items)
	}
	if err := p.Eval(ctx, `nosuchfunction()`, nil); err == nil {
		t.Error("Eval(nosuchfunction()) = nil error; want the exception")
	}
	png, err := p.Screenshot(ctx)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("Screenshot() = %d bytes, %v; want a PNG", len(png), err)
	}
}
