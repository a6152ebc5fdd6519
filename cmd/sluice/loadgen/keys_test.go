package loadgen

import (
	"math"
	"slices"
	"testing"
)

// draw returns how many times each key came out of n picks.
func draw(p picker, keys, n int) []int {
	counts := make([]int, keys)
	for range n {
		counts[p()]++
	}
	return counts
}

// TestUniformCoversEveryKey: uniform picks every key about as often as any
// other.
func TestUniformCoversEveryKey(t *testing.T) {
	const keys, n = 200, 400_000
	counts := draw(newPicker(Uniform, keys, 0, 1, 0), keys, n)
	mean := float64(n) / keys
	for k, c := range counts {
		// 2000 expected, standard deviation about 45: 10% is 4 sigmas.
		if math.Abs(float64(c)-mean) > 0.1*mean {
			t.Errorf("uniform over %d keys, %d picks: key %d came %d times; want %.0f ± 10%%", keys, n, k, c, mean)
		}
	}
}

// TestZipfSkew: zipf picks key k with probability ∝ (1+k)^-s: key 0 about
// 2^s times as often as key 1, and more skew for a higher s.
func TestZipfSkew(t *testing.T) {
	const keys, n = 1000, 400_000
	top := map[float64]float64{} // s → share of key 0
	for _, s := range []float64{1.1, 2} {
		counts := draw(newPicker(Zipf, keys, s, 1, 0), keys, n)
		var h float64 // normalization: Σ (1+k)^-s
		for k := range keys {
			h += math.Pow(1+float64(k), -s)
		}
		for k := range 4 {
			want := float64(n) * math.Pow(1+float64(k), -s) / h
			if got := float64(counts[k]); math.Abs(got-want) > 0.05*want {
				t.Errorf("zipf s=%g over %d keys: key %d came %.0f times in %d; want %.0f ± 5%%", s, keys, k, got, n, want)
			}
		}
		if ratio, want := float64(counts[0])/float64(counts[1]), math.Pow(2, s); math.Abs(ratio-want) > 0.05*want {
			t.Errorf("zipf s=%g: key 0 / key 1 = %.3f; want 2^s = %.3f ± 5%%", s, ratio, want)
		}
		if i := slices.Index(counts, slices.Max(counts)); i != 0 {
			t.Errorf("zipf s=%g: the most picked key is %d; want 0", s, i)
		}
		if counts[keys-1] > counts[0]/100 {
			t.Errorf("zipf s=%g: the last key came %d times, the first %d; want a long tail", s, counts[keys-1], counts[0])
		}
		top[s] = float64(counts[0]) / n
	}
	if top[2] <= top[1.1] {
		t.Errorf("share of key 0: %.3f with s=2, %.3f with s=1.1; want more skew with a higher s", top[2], top[1.1])
	}
	if got := draw(newPicker(Zipf, 1, 1.1, 1, 0), 1, 100); got[0] != 100 {
		t.Errorf("zipf over 1 key: %v; want always key 0", got)
	}
}

// TestHotIsOneKey: hot always picks key 0, whatever the number of keys.
func TestHotIsOneKey(t *testing.T) {
	counts := draw(newPicker(Hot, 10000, 0, 1, 0), 10000, 1000)
	if counts[0] != 1000 {
		t.Errorf("hot: key 0 came %d times in 1000; want every time", counts[0])
	}
}

// TestPickerSeeds: the same seed and stream repeat the same keys; another
// stream (another worker) draws others.
func TestPickerSeeds(t *testing.T) {
	seq := func(seed, stream uint64) []int {
		p := newPicker(Uniform, 1<<20, 0, seed, stream)
		out := make([]int, 20)
		for i := range out {
			out[i] = p()
		}
		return out
	}
	if a, b := seq(7, 3), seq(7, 3); !slices.Equal(a, b) {
		t.Errorf("seed 7 stream 3 drew %v, then %v; want the same keys", a, b)
	}
	if a, b := seq(7, 3), seq(7, 4); slices.Equal(a, b) {
		t.Errorf("streams 3 and 4 drew the same keys %v; want different ones", a)
	}
}
