package api

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/api/limits"
)

// TestRuleStatisticsWhileScraped: descriptors counted from many goroutines
// while the registry gathers are all there at the end, each in its
// statistics (run with -race: the counters are read by the scrapes as
// they are added to).
func TestRuleStatisticsWhileScraped(t *testing.T) {
	reg := prometheus.NewRegistry()
	rs := newRuleStats(reg, 4, 0)
	const workers, each = 8, 500
	stop := make(chan struct{})
	scraped := make(chan error)
	go func() {
		var err error
		for {
			select {
			case <-stop:
				scraped <- err
				return
			default:
			}
			if _, gerr := reg.Gather(); gerr != nil && err == nil {
				err = gerr
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Six keys for a bound of four: two fold into "other".
				d := &envoyDescriptor{limit: 10, cost: 2, entries: []limits.Entry{{Key: "user", Value: fmt.Sprint((w + i) % 6)}}}
				rs.count("edge", &envoyOutcome{d: d, allowed: i%2 == 0, remaining: 1})
			}
		})
	}
	wg.Wait()
	close(stop)
	if err := <-scraped; err != nil {
		t.Fatalf("gather while counting: %v", err)
	}
	sum := func(stat int) (total float64, series int) {
		for _, v := range ruleSeries(t, rs, stat) {
			total += v
			series++
		}
		return total, series
	}
	hits, series := sum(statHits)
	within, _ := sum(statWithin)
	over, _ := sum(statOver)
	near, _ := sum(statNear)
	const n = workers * each
	if hits != 2*n || within != n || over != n || series != 4+1 {
		t.Errorf("hits %v within %v over %v in %d series; want %d, %d, %d in 5 (the bound, and other/other)", hits, within, over, series, 2*n, n, n)
	}
	// Allowed with 9 of 10 used: threshold 8, so 1 of the 2 hits is near.
	if near != n/2 {
		t.Errorf("near-limit hits %v; want %d", near, n/2)
	}
}
