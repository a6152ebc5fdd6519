package control

import (
	"testing"
	"time"
)

// clocks are a machine's three clocks, in nanoseconds, and the reads of
// CLOCK_BOOTTIME through the kernel made of them. A time.Now (now) reads
// the wall clock, then the monotonic clock, each a step after the last
// read; before the read numbered holdAt the thread is held up for a
// millisecond, and between the two readings of the read numbered
// suspendAt the machine is suspended for suspendFor (the boot clock's
// value just before is kept in suspendedAt); right after the kernel's
// read numbered kernelSuspendAt, for suspendFor too.
type clocks struct {
	wall, mono, boot int64
	step             int64
	reads, kernel    int

	holdAt, suspendAt, kernelSuspendAt int
	suspendFor                         int64
	suspendedAt                        int64
}

func (m *clocks) cache() *bootCache {
	return &bootCache{
		now: func() (int64, int64) {
			m.reads++
			if m.reads == m.holdAt {
				m.advance(int64(time.Millisecond))
			}
			m.advance(m.step)
			w := m.wall
			if m.reads == m.suspendAt {
				m.suspendedAt = m.boot
				m.suspend(m.suspendFor)
			}
			m.advance(m.step)
			return w, m.mono
		},
		boot: func() int64 {
			m.kernel++
			m.advance(1500) // a system call takes a while
			b := m.boot
			if m.kernel == m.kernelSuspendAt {
				m.suspend(m.suspendFor)
			}
			return b
		},
	}
}

func (m *clocks) advance(d int64) { m.wall, m.mono, m.boot = m.wall+d, m.mono+d, m.boot+d }

// suspend is a suspend of d: the boot and wall clocks count it, the
// monotonic clock does not.
func (m *clocks) suspend(d int64) { m.wall, m.boot = m.wall+d, m.boot+d }

func TestBootCache(t *testing.T) {
	newMachine := func() *clocks {
		return &clocks{wall: 1_700_000_000e9, mono: 5e9, boot: 7e9, step: 30}
	}
	// check reads c and wants CLOCK_BOOTTIME within bootTolerance below the
	// machine's (the cache may lag by that much, never lead), and kernel
	// reads so far.
	check := func(t *testing.T, m *clocks, c *bootCache, kernel int) {
		t.Helper()
		got := int64(c.read())
		if got > m.boot || got < m.boot-bootTolerance {
			t.Errorf("read %d; want at most bootTolerance below the boot clock, %d", got, m.boot)
		}
		if m.kernel != kernel {
			t.Errorf("%d reads of CLOCK_BOOTTIME through the kernel; want %d", m.kernel, kernel)
		}
	}
	t.Run("steady", func(t *testing.T) {
		m := newMachine()
		c := m.cache()
		check(t, m, c, 1)
		for range 100 {
			m.advance(int64(time.Millisecond))
			check(t, m, c, 1)
		}
	})
	t.Run("resume", func(t *testing.T) {
		m := newMachine()
		c := m.cache()
		check(t, m, c, 1)
		m.suspend(int64(3 * time.Second))
		check(t, m, c, 2)
		check(t, m, c, 2)
		m.suspend(int64(3 * bootTolerance))
		check(t, m, c, 3)
	})
	t.Run("wall clock stepped", func(t *testing.T) {
		for _, d := range []int64{int64(-time.Second), int64(time.Hour)} {
			m := newMachine()
			c := m.cache()
			check(t, m, c, 1)
			m.wall += d
			check(t, m, c, 2)
			check(t, m, c, 2)
		}
	})
	t.Run("held up between readings", func(t *testing.T) {
		m := newMachine()
		c := m.cache()
		check(t, m, c, 1)
		// The thread loses its CPU between the two readings of a sample:
		// the skew looks unchanged, but the sample is not trusted.
		m.holdAt = m.reads + 2
		check(t, m, c, 2)
	})
	t.Run("suspended between readings", func(t *testing.T) {
		m := newMachine()
		c := m.cache()
		check(t, m, c, 1)
		// A suspend after the wall clock's reading of a sample and before
		// the monotonic clock's: the read is of the moment before it, and
		// the next one sees it.
		m.suspendAt, m.suspendFor = m.reads+2, int64(2*time.Second)
		got := int64(c.read())
		if got > m.suspendedAt || got < m.suspendedAt-bootTolerance {
			t.Errorf("read %d across a suspend; want the boot clock just before it, %d", got, m.suspendedAt)
		}
		check(t, m, c, 2)
	})
	t.Run("suspended while resyncing", func(t *testing.T) {
		m := newMachine()
		c := m.cache()
		// Suspended right after the kernel's answer: the samples around it
		// disagree, and the next try keeps what the kernel says after.
		m.kernelSuspendAt, m.suspendFor = 1, int64(2*time.Second)
		c.read()
		check(t, m, c, 2)
		m.advance(int64(time.Millisecond))
		check(t, m, c, 2)
	})
	t.Run("held up while resyncing", func(t *testing.T) {
		m := newMachine()
		c := m.cache()
		// Held up between the kernel's answer and the sample after it: the
		// answer is not matched with that sample's monotonic reading.
		m.holdAt = 3
		c.read()
		check(t, m, c, 2)
	})
	t.Run("never trusted", func(t *testing.T) {
		m := newMachine()
		m.step = bootTolerance // every sample held up
		c := m.cache()
		for n := 1; n <= 3; n++ {
			if got := int64(c.read()); got != m.boot {
				t.Errorf("read %d; want the kernel's %d", got, m.boot)
			}
		}
		if m.kernel != 3*4 {
			t.Errorf("%d kernel reads for 3 reads; want 4 each (3 tries, then the read itself)", m.kernel)
		}
	})
}
