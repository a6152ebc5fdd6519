package persist

import (
	"fmt"
	"os"
)

// Report is what Verify found in a data file.
type Report struct {
	// Records is how many records of the keys bucket were read.
	Records int
	// Pages lists the damaged pages: a damaged meta page, and each subtree
	// of the file that cannot be walked (its records are not read).
	Pages []string
	// Damaged lists the records whose value the caller's check refused,
	// or that are shorter than their deadline.
	Damaged []DamagedRecord
}

// DamagedRecord is a record that cannot be used.
type DamagedRecord struct {
	Key    string
	Reason string
}

// OK reports whether nothing is damaged.
func (r *Report) OK() bool { return len(r.Pages) == 0 && len(r.Damaged) == 0 }

// Verify reads the data file at path, read-only, and reports every damaged
// page and record it finds; it never writes to the file. check, called for
// each record of the keys bucket with its key and value (the bytes after
// the deadline), says what is wrong with a value, as persist itself never
// decodes values. It does not take the file's lock (a running node may be
// writing it: stop it first) and does not read WAL files.
//
// It walks bbolt's pages itself, as Open does before it opens a file, but
// notes each damaged subtree (its records are not read) and goes on with
// the next one, so that one damaged page hides no other damage.
func Verify(path string, check func(key string, value []byte) error) (Report, error) {
	var rep Report
	info, err := os.Stat(path)
	if err != nil {
		return rep, fmt.Errorf("persist: verify: %v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return rep, fmt.Errorf("persist: verify: %v", err)
	}
	defer f.Close()
	w := &pageWalker{f: f, path: path, all: true}
	m, damage, err := w.meta()
	if err != nil {
		return rep, newError(ErrFormat, "persist: verify %s: %v", path, err) // no meta page to start from
	}
	if damage.page >= 0 {
		rep.Pages = append(rep.Pages, damage.String())
	}
	if need := int64(m.pgid) * int64(m.pageSize); need > info.Size() {
		rep.Pages = append(rep.Pages, fmt.Sprintf("the file is truncated: %d bytes, bbolt expects %d", info.Size(), need))
	}
	w.pageSize, w.high = m.pageSize, m.pgid
	w.seen = make(map[uint64]bool)
	w.record = func(bucket string, k, v []byte) {
		if bucket != string(bucketKeys) {
			return
		}
		rep.Records++
		if len(v) < 8 {
			rep.Damaged = append(rep.Damaged, DamagedRecord{string(k), fmt.Sprintf("%d bytes, shorter than its deadline", len(v))})
		} else if err := check(string(k), v[8:]); err != nil {
			rep.Damaged = append(rep.Damaged, DamagedRecord{string(k), err.Error()})
		}
	}
	if m.freelist != noFreelist {
		if err := w.freelistPage(m.freelist); err != nil {
			w.problems = append(w.problems, err)
		}
	}
	if err := w.bucket(m.root, nil); err != nil {
		w.problems = append(w.problems, err)
	}
	for _, p := range w.problems {
		rep.Pages = append(rep.Pages, p.Error())
	}
	return rep, nil
}
