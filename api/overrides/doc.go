// Package overrides keeps a node's overrides: the limits, windows and
// algorithms that operators set on a key or a prefix of keys, in force
// over whatever checks and the limits file say, until they expire.
//
// A Table holds them for the checks (Match reads a snapshot without
// locks), keeps them in the data file's meta bucket "overrides" (see
// store.go for the records), and copies each change to the other members
// of a cluster, which apply the same overrides (Replicate; Sync copies
// another member's when a node joins). The admin API (package api)
// validates the calls and answers them; this package owns the state.
//
// Writers (Set, Delete) are serialized by the table's lock, under which
// the data file is written first and the snapshot replaced after, so that
// the file and the table change in the same order.
package overrides
