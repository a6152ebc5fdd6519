package loadgen

import "math/rand/v2"

// picker returns the number of the key of the next check, in [0, keys).
// A picker belongs to one worker: it is not safe for concurrent use.
type picker func() int

// newPicker returns the picker of dist over keys keys (one key for Hot),
// seeded with seed and stream, so that each worker draws its own sequence
// and a run can be repeated.
func newPicker(dist Dist, keys int, zipfS float64, seed, stream uint64) picker {
	r := rand.New(rand.NewPCG(seed, stream))
	switch dist {
	case Zipf:
		if keys == 1 {
			return func() int { return 0 }
		}
		z := rand.NewZipf(r, zipfS, 1, uint64(keys-1))
		return func() int { return int(z.Uint64()) }
	case Hot:
		return func() int { return 0 }
	default:
		return func() int { return r.IntN(keys) }
	}
}
