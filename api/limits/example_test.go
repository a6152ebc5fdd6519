package limits_test

import (
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-io/sluice/api/limits"
)

func Example() {
	cfg, err := limits.Parse("edge.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`))
	if err != nil {
		log.Fatal(err)
	}
	for _, ip := range []string{"10.0.0.1", "50.0.0.5"} {
		rule, ok := cfg.Lookup("edge", []limits.Entry{{Key: "remote_address", Value: ip}})
		fmt.Println(ip, ok, rule.Limit, rule.Window, rule.Path)
	}
	_, ok := cfg.Lookup("edge", []limits.Entry{{Key: "user", Value: "bob"}})
	fmt.Println("user", ok)
	// Output:
	// 10.0.0.1 true 10 1s domain=edge key=remote_address
	// 50.0.0.5 true 0 1s domain=edge key=remote_address value=50.0.0.5
	// user false
}

func Example_errors() {
	_, err := limits.Parse("rules.yaml", []byte(`domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: fortnight
      requests_per_unit: 10
`))
	fmt.Println(err)
	// Output:
	// limits: rules.yaml:5: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
}

// A service keeps its limits current with a Watcher and reads them on every
// request with Current.
func ExampleWatcher() {
	w, err := limits.NewWatcher(limits.WatcherOptions{
		Path:   "/etc/sluice/limits", // a ConfigMap volume, say
		Logger: slog.Default(),
	})
	if err != nil {
		log.Fatal(err) // the limits in place at start must load
	}
	defer w.Close()
	w.Start()

	// Reload at once on SIGHUP; a bad change is logged and refused.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			w.Reload()
		}
	}()

	// On each request:
	if rule, ok := w.Current().Lookup("edge", []limits.Entry{{Key: "remote_address", Value: "10.0.0.1"}}); ok {
		fmt.Println(rule.Limit, rule.Window)
	}
}
