package cluster

import (
	"fmt"
	"math"
	"testing"
)

func testMembers(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{
			Name:       fmt.Sprintf("sluice-%d", i),
			GossipAddr: fmt.Sprintf("10.0.0.%d:7946", i+1),
			GRPCAddr:   fmt.Sprintf("10.0.0.%d:8081", i+1),
			State:      StateAlive,
		}
	}
	return ms
}

const shareKeys = 100_000

func shareKey(i int) string { return fmt.Sprintf("tenant-%d:route", i) }

// TestOwnerShare: over 100k keys, each of N members owns 1/N of them within
// a few percent (five standard deviations of a binomial, about ±3.5% of the
// share for 3 nodes and ±5% for 10).
func TestOwnerShare(t *testing.T) {
	for _, n := range []int{3, 5, 10} {
		v := NewView(1, testMembers(n))
		counts := make(map[string]int)
		for i := 0; i < shareKeys; i++ {
			counts[v.Owner(shareKey(i)).Name]++
		}
		mean := float64(shareKeys) / float64(n)
		sigma := math.Sqrt(mean * (1 - 1/float64(n)))
		line := ""
		worst := 0.0
		for _, m := range v.Members {
			c := counts[m.Name]
			dev := (float64(c) - mean) / mean
			worst = max(worst, math.Abs(dev))
			line += fmt.Sprintf(" %s=%.2f%%", m.Name, 100*float64(c)/shareKeys)
			if math.Abs(float64(c)-mean) > 5*sigma {
				t.Errorf("%d nodes: %s owns %d of %d keys; want %.0f ± %.0f", n, m.Name, c, shareKeys, mean, 5*sigma)
			}
		}
		t.Logf("%2d nodes, %d keys, ideal %.2f%% each:%s (worst %.1f%% off the ideal)", n, shareKeys, 100/float64(n), line, 100*worst)
	}
}

// TestOwnerMovement states rendezvous hashing's promise: a node that joins
// takes about 1/N of the keys and every key that moves goes to it; a node
// that leaves gives away its keys and no other key moves.
func TestOwnerMovement(t *testing.T) {
	ms := testMembers(4)
	three, four := NewView(1, ms[:3]), NewView(2, ms)

	moved := 0
	for i := 0; i < shareKeys; i++ {
		k := shareKey(i)
		before, after := three.Owner(k), four.Owner(k)
		if before.Name != after.Name {
			moved++
			if after.Name != "sluice-3" {
				t.Fatalf("%s moved from %s to %s when sluice-3 joined; only moves to the joiner are allowed", k, before.Name, after.Name)
			}
		}
	}
	frac := float64(moved) / shareKeys
	t.Logf("4th node joins 3: %d of %d keys moved (%.2f%%; ideal 25%%), all to the new node", moved, shareKeys, 100*frac)
	if math.Abs(frac-0.25) > 0.01 {
		t.Errorf("joining 3 nodes moved %.2f%% of keys; want 25%% ± 1%%", 100*frac)
	}

	leaver := "sluice-1"
	var others []Member
	for _, m := range ms {
		if m.Name != leaver {
			others = append(others, m)
		}
	}
	rest := NewView(3, others)
	moved, owned := 0, 0
	for i := 0; i < shareKeys; i++ {
		k := shareKey(i)
		before, after := four.Owner(k), rest.Owner(k)
		if before.Name == leaver {
			owned++
		}
		if before.Name != after.Name {
			moved++
			if before.Name != leaver {
				t.Fatalf("%s moved from %s to %s when %s left; only the leaver's keys may move", k, before.Name, after.Name, leaver)
			}
		}
	}
	t.Logf("1 of 4 nodes leaves: %d of %d keys moved (%.2f%%), exactly the leaver's %d", moved, shareKeys, 100*float64(moved)/shareKeys, owned)
	if moved != owned {
		t.Errorf("%d keys moved when %s left; want exactly its %d", moved, leaver, owned)
	}
}

// TestOwnerByNameNotAddress: a member that comes back on another address
// owns the same keys.
func TestOwnerByNameNotAddress(t *testing.T) {
	ms := testMembers(3)
	before := NewView(1, ms)
	ms[1].GossipAddr, ms[1].GRPCAddr = "10.9.9.9:7000", "10.9.9.9:9000"
	after := NewView(2, ms)
	for i := 0; i < 10_000; i++ {
		k := shareKey(i)
		if b, a := before.Owner(k), after.Owner(k); b.Name != a.Name {
			t.Fatalf("%s: owner %s before the address change, %s after", k, b.Name, a.Name)
		}
	}
}

func TestNewView(t *testing.T) {
	ms := []Member{
		{Name: "c", State: StateAlive},
		{Name: "a", State: StateAlive, GRPCAddr: "first"},
		{Name: "b", State: StateDead},
		{Name: "a", State: StateAlive, GRPCAddr: "second"},
		{Name: "d", State: StateLeft},
	}
	v := NewView(7, ms)
	var got []string
	for _, m := range v.Members {
		got = append(got, m.Name+"/"+m.State.String())
	}
	if want := "[a/alive c/alive]"; fmt.Sprint(got) != want {
		t.Errorf("NewView(%v).Members = %v; want %s (live only, sorted, first of a name)", ms, got, want)
	}
	if m, ok := v.Member("a"); !ok || m.GRPCAddr != "first" {
		t.Errorf("Member(a) = %+v, %v; want the first a", m, ok)
	}
	if _, ok := v.Member("b"); ok {
		t.Errorf("Member(b) found a dead member")
	}
	if v.Len() != 2 {
		t.Errorf("Len() = %d; want 2", v.Len())
	}
	empty := NewView(0, nil)
	if got := empty.Owner("k"); got.Name != "" {
		t.Errorf("empty view: Owner(k) = %+v; want the zero Member", got)
	}
	if got := empty.OwnerIndex(1); got != -1 {
		t.Errorf("empty view: OwnerIndex = %d; want -1", got)
	}
}

func TestOwnerAllocs(t *testing.T) {
	v := NewView(1, testMembers(100))
	if got := testing.AllocsPerRun(100, func() { _ = v.Owner("user:12345") }); got != 0 {
		t.Errorf("View.Owner allocates %v times per call; want 0", got)
	}
}

func BenchmarkViewOwner(b *testing.B) {
	for _, n := range []int{3, 10, 100} {
		v := NewView(1, testMembers(n))
		keys := make([]string, 1024)
		for i := range keys {
			keys[i] = fmt.Sprintf("tenant-%d:route", i)
		}
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				_ = v.Owner(keys[i&1023])
			}
		})
	}
}
