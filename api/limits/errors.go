package limits

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Error is a problem found while reading or checking a limits file. Parse,
// Load and the Watcher return it either alone or, when a load finds several
// problems, joined with the others (errors.Join); errors.As finds the first.
type Error struct {
	// File is the file's name as given to Parse, or its path under Load.
	// It is empty for a problem that belongs to no one file.
	File string
	// Line is the 1-based line the problem is on, or 0 when it has none
	// (a file that cannot be read, say).
	Line int
	// Reason says what is wrong and, where it can, what to change.
	Reason string
	// Err is the underlying error, if any (an I/O error from Load, for
	// example); Unwrap returns it so that errors.Is(err, fs.ErrNotExist)
	// works.
	Err error
}

// Error returns "limits: FILE:LINE: REASON", leaving out what is unknown.
func (e *Error) Error() string {
	switch {
	case e.File != "" && e.Line > 0:
		return fmt.Sprintf("limits: %s:%d: %s", e.File, e.Line, e.Reason)
	case e.File != "":
		return fmt.Sprintf("limits: %s: %s", e.File, e.Reason)
	case e.Line > 0:
		return fmt.Sprintf("limits: line %d: %s", e.Line, e.Reason)
	default:
		return "limits: " + e.Reason
	}
}

// Unwrap returns the underlying error, or nil.
func (e *Error) Unwrap() error { return e.Err }

// maxErrors bounds how many problems one load reports, so that a file that
// is wrong everywhere gives a readable message.
const maxErrors = 10

// maxKept bounds how many problems one load keeps before sorting.
const maxKept = 1000

// problems collects the errors of one load.
type problems struct {
	list    []*Error
	dropped int
}

func (ps *problems) add(e *Error) {
	if len(ps.list) >= maxKept {
		ps.dropped++
		return
	}
	ps.list = append(ps.list, e)
}

// sortFrom puts the problems from the i-th on in line order; they belong to
// one file.
func (ps *problems) sortFrom(i int) {
	slices.SortStableFunc(ps.list[i:], func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
}

// err returns nil, the single *Error, or the first maxErrors joined.
func (ps *problems) err() error {
	switch {
	case len(ps.list) == 0:
		return nil
	case len(ps.list) == 1 && ps.dropped == 0:
		return ps.list[0]
	}
	shown := ps.list[:min(len(ps.list), maxErrors)]
	errs := make([]error, 0, len(shown)+1)
	for _, e := range shown {
		errs = append(errs, e)
	}
	if more := ps.dropped + len(ps.list) - len(shown); more > 0 {
		errs = append(errs, &Error{Reason: fmt.Sprintf("%d more problems not shown; fix the ones above first", more)})
	}
	return errors.Join(errs...)
}

// yamlLine matches the position prefix of a YAML syntax error.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError turns an error from the YAML parser into an *Error with the
// line it names.
func syntaxError(file string, err error) *Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: file, Line: line, Reason: "invalid YAML: " + m[2]}
	}
	return &Error{File: file, Reason: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}
