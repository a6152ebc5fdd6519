package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
	"github.com/sluice-io/sluice/cmd/sluice/node"
)

// sluiceAddr is the address of the node the examples call, started by
// TestMain on 127.0.0.1:0. In a real program: sluice serve's --grpc-addr.
var sluiceAddr string

func startExampleNode() (stop func(), err error) {
	cfg := node.DefaultConfig()
	cfg.NodeName = "example"
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", ""
	cfg.Durability, cfg.DataDir = "memory", ""
	cfg.Engine.Actors = 2
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Start(); err != nil {
		n.Shutdown(context.Background())
		return nil, err
	}
	sluiceAddr = n.GRPCAddr()
	return func() { n.Shutdown(context.Background()) }, nil
}

// A login handler limited per client IP and per submitted username: both
// in one all-or-nothing call, failing closed if Sluice is away. Other
// routes are limited per API key, failing open.
func Example() {
	cfg := client.DefaultConfig()
	cfg.Addr = sluiceAddr
	cfg.Timeout = time.Second // for the test run's sake; the default 20 ms is the one to keep
	c, err := client.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Connect(context.Background()); err != nil {
		log.Fatal(err) // no point starting without Sluice; or go on, failing open
	}

	login, err := httplimit.New(httplimit.Config{
		Client: c,
		Rules: []httplimit.Rule{
			{Name: "login_ip", Key: httplimit.ClientIP(), Limit: 20, Window: time.Hour, OnFailure: client.FailClosed},
			{Name: "login_user", Key: httplimit.Form("username"), Limit: 2, Window: 15 * time.Minute, OnFailure: client.FailClosed},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	api, err := httplimit.New(httplimit.Config{
		Client: c,
		Rules:  []httplimit.Rule{{Name: "per_key", Key: httplimit.Header("X-API-Key"), Limit: 100, Window: time.Minute}},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /login", login.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "welcome "+r.PostFormValue("username"))
	})))
	mux.Handle("/api/", api.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	srv := httptest.NewServer(mux) // http.ListenAndServe(addr, mux) in a real program
	defer srv.Close()

	for range 3 {
		resp, err := http.PostForm(srv.URL+"/login", url.Values{"username": {"alice"}, "password": {"..."}})
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status, resp.Header.Get("RateLimit-Policy"))
		if resp.StatusCode == http.StatusOK {
			fmt.Println(string(body))
		}
	}
	// Output:
	// 200 OK "login_ip";q=20;w=3600, "login_user";q=2;w=900
	// welcome alice
	// 200 OK "login_ip";q=20;w=3600, "login_user";q=2;w=900
	// welcome alice
	// 429 Too Many Requests "login_ip";q=20;w=3600, "login_user";q=2;w=900
}
