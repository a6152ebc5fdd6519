// Package limits reads the limits files of envoyproxy/ratelimit, the
// reference Envoy rate limit service, so that Sluice runs the
// configuration its users already have: it parses and checks them, finds
// the rule for a request descriptor, and reloads them when they change.
//
// # Files
//
// A file has a domain and a tree of descriptors; a descriptor has a key, an
// optional value and an optional rate_limit (unit and requests_per_unit, or
// unlimited: true), and may nest further descriptors. Load reads one file,
// or every *.yaml and *.yml file of a directory, one domain per file. The
// fields, units (second to year, any case) and checks are those of
// envoyproxy/ratelimit, with these differences, each of which turns a
// silent surprise into an error that says what to change:
//
//   - Each mapping accepts only its own fields: shadow_mode inside
//     rate_limit, or unit next to it, is an error (ratelimit checks names
//     against one list for the whole file and ignores misplaced ones).
//   - A rate_limit needs requests_per_unit (ratelimit reads a missing one
//     as 0, which blocks every request); an unlimited one takes neither a
//     unit nor a non-zero requests_per_unit; an empty rate_limit is an
//     error, not a descriptor without a limit.
//   - A key may not contain '*' (ratelimit would treat it as part of a
//     pattern on "key_value"), keys and values are matched as a pair rather
//     than as the string key + "_" + value, and a file holds exactly one
//     YAML document.
//   - A domain defined in two files is an error unless
//     LoadOptions.MergeDomains (WatcherOptions.MergeDomains; ratelimit's
//     MERGE_DOMAIN_CONFIG) lets it span them; then, as in ratelimit, the
//     files' top-level descriptors are put together and one repeated in
//     two files is an error.
//
// The fields that name ratelimit's statistics, detailed_metric and
// value_to_metric, shape each rule's statistics key as they do in
// ratelimit (Rule.StatKey, Rule.RequestStatKey). quota_mode,
// share_threshold and metadata, which ratelimit added after its README's
// format section, are supported.
//
// Every problem is reported as an *Error with its file and line; a load
// reports up to ten of them at once.
//
// # Matching
//
// Config.Lookup walks a request descriptor's entries down one domain's
// tree. At each level it takes, for the entry (key, value), the descriptor
// with that key and exactly that value; failing that, the first descriptor
// of that key, in file order, whose value is a wildcard pattern the value
// matches (each '*' matches any run of characters, the empty one
// included); failing that, the key's descriptor without a value, which
// matches any value. It never backtracks. The rule is the rate_limit of the
// descriptor the last entry reaches: a descriptor with more entries than
// the tree is deep, or that ends on a descriptor without a rate_limit, has
// no rule. Keys and values are case-sensitive.
//
// Counters are per request descriptor, not per rule: a key-only descriptor
// such as remote_address gives each address its own counter. Config.Match
// returns the descriptor to count under, in which share_threshold (a
// ratelimit extension) replaces a wildcard-matched value with its pattern.
// ApplyReplaces applies rate_limit.replaces across the rules of one
// request.
//
// # Concurrency
//
// A Config is immutable once Parse or Load returns it, and every method is
// safe to call from any number of goroutines; Rules are shared and
// read-only. A Watcher holds the Config in force in an atomic pointer:
// Current takes no lock, and a reload builds a whole new Config before
// swapping it in, so a request sees either the old limits or the new, never
// a mixture, and never waits. Reloads (the polling goroutine's and
// Reload's) are serialized by a mutex that the read path never takes. The
// polling goroutine is the package's only background work: every Interval
// it reads and hashes the files, which costs in proportion to their size
// and nothing per rate-limited key. Close stops it and waits for it.
//
// # xDS
//
// A Watcher with WatcherOptions.XDS takes the limits from an xDS
// management server instead of files, as envoyproxy/ratelimit does with
// CONFIG_TYPE=GRPC_XDS_SOTW: the resources of type RateLimitConfigTypeURL
// (go-control-plane's ratelimit.config.ratelimit.v3.RateLimitConfig, a
// limits file as a protobuf message) over one Aggregated Discovery Service
// stream, state of the world. Each response is checked as a directory of
// files would be, then ACKed and put in force, or NACKed with its problems;
// its one goroutine keeps the stream open, and Close ends it. Package
// xdstest is a management server for tests.
package limits
