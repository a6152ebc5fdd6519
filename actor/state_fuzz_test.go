package actor

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// stBuild interprets ops as a sequence of checks, 4 bytes each, and returns
// the state they build (so that the fuzzer explores states decide can reach).
func stBuild(ops []byte) (state, int64) {
	var s state
	now := st0
	limit, window := int64(5), int64(stSec)
	maxRuns := 3 + int(len(ops)%5)
	var d Decision
	for len(ops) >= 4 {
		op := ops[:4]
		ops = ops[4:]
		switch op[3] & 0x7 {
		case 0:
			limit = 1 + int64(op[2])%12
		case 1:
			window = int64(stMs) * (1 + int64(op[2])%50)
		case 2:
			now -= int64(op[2]) * int64(stMs) / 10 // the clock goes back
		default:
			now += int64(op[2]) * int64(stMs) / 10
		}
		c := Check{
			Key:       "k",
			Limit:     limit,
			Window:    time.Duration(window),
			Algorithm: Algorithm(op[0] % 3),
			Cost:      int64(op[1]) % (limit + 1),
			Refund:    op[3]&0x10 != 0,
			Penalty:   op[3]&0x20 != 0,
		}
		id := ReservationID{1 + op[2]%4}
		switch op[3] & 0xc0 {
		case 0x40: // a usage report, which may be above the limit
			c.Usage, c.Refund, c.Penalty = true, false, false
			c.Cost = int64(op[1]) % (2*limit + 1)
		case 0x80: // a reservation
			c.Refund, c.Penalty = false, false
			c.Cost = max(c.Cost, 1)
			c.Reservation = &Reservation{ID: id, TTL: time.Duration(window) * time.Duration(1+op[0]%3) / 2}
		case 0xc0: // a settle
			c.Refund, c.Penalty = false, false
			c.Cost = int64(op[1]) % (2*limit + 1)
			c.Reservation = &Reservation{ID: id, Settle: true}
		}
		s.decide(now, &c, maxRuns, &d)
	}
	return s, now
}

// stSame reports whether a and b hold the same state, lineage and
// reservations included.
func stSame(a, b *state) bool {
	var ra, rb []reservation
	if a.res != nil {
		ra = a.res.list
	}
	if b.res != nil {
		rb = b.res.list
	}
	return a.algo == b.algo && a.limit == b.limit && a.window == b.window && a.lineage == b.lineage &&
		slices.Equal(ra, rb) &&
		a.at == b.at && a.prev == b.prev && a.cur == b.cur &&
		math.Float64bits(a.tokens) == math.Float64bits(b.tokens) &&
		slices.Equal(a.appendEntries(nil), b.appendEntries(nil))
}

// FuzzDecodeState checks that decode never panics and either returns an
// error prefixed "actor: decode state: ", leaving the state alone, or a state
// that encodes canonically and decides without panicking; and that every
// state decide builds (from the same bytes read as checks) round-trips.
func FuzzDecodeState(f *testing.F) {
	for _, ops := range [][]byte{
		{0, 1, 0, 3, 0, 1, 1, 3, 0, 1, 2, 3, 0, 1, 3, 3},
		{1, 2, 5, 3, 1, 1, 200, 3, 1, 3, 0, 0x23},
		{2, 4, 9, 3, 2, 1, 10, 3, 2, 1, 10, 0x13},
		{0, 9, 0, 0x23, 0, 9, 0, 0x23, 1, 0, 0, 3, 2, 3, 4, 2},
		{0, 3, 1, 0x83, 0, 2, 2, 0x83, 0, 9, 0, 0x43, 0, 1, 1, 0xc3},  // log: reserve, reserve, usage, settle
		{1, 3, 1, 0x83, 1, 9, 0, 0x43, 1, 0, 2, 0xc3},                 // window counter
		{2, 3, 1, 0x83, 2, 11, 0, 0x43, 2, 7, 1, 0xc3, 2, 9, 0, 0x43}, // token bucket into debt
	} {
		s, _ := stBuild(ops)
		f.Add(s.appendBinary(nil))
		f.Add(ops)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 1, 1, 0})
	f.Add([]byte{1, 0, 1, 1, 1, 0, 1})
	f.Add([]byte{1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0xf8, 0x7f})

	f.Fuzz(func(t *testing.T, data []byte) {
		// decode any bytes.
		orig, _ := stBuild([]byte{0, 1, 0, 3, 0, 1, 7, 3})
		s := orig.clone()
		if err := s.decode(data); err != nil {
			if !strings.HasPrefix(err.Error(), "actor: decode state: ") {
				t.Fatalf("decode(%x) = %v; want the prefix \"actor: decode state: \"", data, err)
			}
			if !stSame(&s, &orig) {
				t.Fatalf("decode(%x) failed (%v) but changed the state", data, err)
			}
		} else {
			enc := s.appendBinary(nil)
			var u state
			if err := u.decode(enc); err != nil {
				t.Fatalf("decode(%x) = %+v, whose encoding %x does not decode: %v", data, s, enc, err)
			}
			if !stSame(&s, &u) || !bytes.Equal(u.appendBinary(nil), enc) {
				t.Fatalf("decode(%x) = %+v; re-encoded and decoded: %+v", data, s, u)
			}
			for _, now := range []int64{math.MinInt64, 0, st0, math.MaxInt64} {
				c := Check{Key: "k", Limit: 3, Window: stSec, Algorithm: s.algo, Cost: 1, Penalty: true}
				var d Decision
				w := s.clone()
				w.decide(now, &c, 4, &d)
				w.deadline()
				w.isEmpty(now)
				w.usedAt(now)
			}
		}

		// Round-trip the states decide builds.
		b, now := stBuild(data)
		if b.limit == 0 {
			return
		}
		enc := b.appendBinary(nil)
		var u state
		if err := u.decode(enc); err != nil {
			t.Fatalf("decode(appendBinary(%+v)) = %v", b, err)
		}
		if !stSame(&b, &u) {
			t.Fatalf("decode(appendBinary(%+v)) = %+v", b, u)
		}
		c := Check{Key: "k", Limit: b.limit, Window: time.Duration(b.window), Algorithm: b.algo, Cost: 1}
		var d1, d2 Decision
		b.decide(now+int64(stMs), &c, 5, &d1)
		u.decide(now+int64(stMs), &c, 5, &d2)
		if d1 != d2 {
			t.Fatalf("after a round trip, decide(cost=1) = %+v; want %+v", d2, d1)
		}
	})
}

// TestDecodeStateErrors checks that malformed input is refused with a clear
// error.
func TestDecodeStateErrors(t *testing.T) {
	valid := func() []byte {
		var s state
		var d Decision
		c := Check{Key: "k", Limit: 10, Window: stSec, Cost: 2}
		s.decide(st0, &c, 100, &d)
		s.decide(st0+5, &c, 100, &d)
		return s.appendBinary(nil)
	}()
	rec := append(append([]byte{9}, make([]byte, 15)...), 0, 2, 0) // id 9, mark 0, estimate 2, expiry 0
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "0 bytes"},
		{"version 0", append([]byte{0}, valid[1:]...), "unknown encoding version 0"},
		{"version 5", append([]byte{5}, valid[1:]...), "unknown encoding version 5"},
		{"version 4 without reservations", append(append([]byte{4}, valid[1:]...), 0), "without reservations or debt"},
		{"version 4 after the first", append(slices.Clip(valid), append([]byte{4}, valid[1:]...)...), "version 4 after the first segment"},
		{"reservations truncated", append(append([]byte{4}, valid[1:]...), 1, 7), "1 reservations in 1 bytes"},
		{"too many reservations", append(append([]byte{4}, valid[1:]...), 0x81, 0x08), "1025 reservations; at most 1024"},
		{"zero reservation id", append(append(append([]byte{4}, valid[1:]...), 1), make([]byte, 19)...), "id is zero"},
		{"zero estimate", append(append(append([]byte{4}, valid[1:]...), 1, 9), make([]byte, 18)...), "estimate 0 is not positive"},
		{"repeated reservation", append(append(append([]byte{4}, valid[1:]...), 2), append(slices.Clip(rec), rec...)...), "id repeated"},
		{"debt in version 3", []byte{3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0xbf}, "outside [0, 1]"},
		{"debt below -limit", []byte{4, 2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0}, "outside [-1, 1]"},
		{"full segment after the first", append(slices.Clip(valid), valid...), "version 3 after the first segment"},
		{"version 1 after the first", append(slices.Clip(valid), append([]byte{1, 0}, valid[10:]...)...), "version 1 after the first segment"},
		{"lineage 0", append([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0}, valid[10:]...), "lineage 0"},
		{"lineage truncated", []byte{3, 0, 1, 2, 3}, "lineage: truncated"},
		{"tail of a window counter", []byte{1, 1, 1, 1, 0, 0, 0, 2, 1, 1, 1, 0, 0, 0}, "trailing bytes"},
		{"tail earlier than the log", append(slices.Clip(valid), 2, 0, 10, 0x80, 0x94, 0xeb, 0xdc, 0x03, 1, 2, 1), "before the previous segment's last run"},
		{"unknown algorithm", []byte{1, 3, 1, 1}, "unknown algorithm 3"},
		{"zero limit", []byte{1, 0, 0, 1, 0}, "limit 0 is not positive"},
		{"zero window", []byte{1, 0, 1, 0, 0}, "window 0 is not positive"},
		{"truncated", valid[:len(valid)-1], "truncated"},
		{"trailing byte", append(slices.Clip(valid), 0), "segment 1: 1 bytes"},
		{"zero count", []byte{1, 0, 1, 1, 1, 2, 0}, "count 0 is not positive"},
		{"equal timestamps", []byte{1, 0, 1, 1, 2, 2, 1, 0, 1}, "equal to the previous one"},
		{"huge log", []byte{1, 0, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}, "runs in"},
		{"limit overflows", []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1, 0}, "overflows"},
		{"tokens above limit", []byte{1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x40}, "outside [0, 1]"},
		{"NaN tokens", []byte{1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0xf8, 0x7f}, "outside [0, 1]"},
	} {
		var s state
		err := s.decode(tc.in)
		if err == nil || !strings.HasPrefix(err.Error(), "actor: decode state: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: decode(%x) = %v; want an error with %q", tc.name, tc.in, err, tc.want)
		}
	}
}

// TestStateRoundTrip checks that each algorithm's state survives
// appendBinary and decode, and how many bytes it takes.
func TestStateRoundTrip(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		var s state
		var d Decision
		c := Check{Key: "k", Limit: 100, Window: stSec, Algorithm: algo, Cost: 1}
		for i := range 100 {
			s.decide(st0+int64(i)*int64(stMs), &c, 1000, &d)
		}
		enc := s.appendBinary(nil)
		var u state
		if err := u.decode(enc); err != nil || !stSame(&s, &u) {
			t.Fatalf("%v: decode(appendBinary(%+v)) = %+v, %v", algo, s, u, err)
		}
		t.Logf("%v, 100 hits 1ms apart: %d bytes encoded", algo, len(enc))
	}
}
