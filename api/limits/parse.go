package limits

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// source is one file's name and contents.
type source struct {
	name string
	data []byte
}

// Parse parses and checks one limits file; name is used in rules and error
// messages. Every problem found is reported (up to ten), each as an *Error
// with its line.
func Parse(name string, data []byte) (*Config, error) {
	return build([]source{{name: name, data: data}}, LoadOptions{})
}

// LoadOptions changes how Load reads several files.
type LoadOptions struct {
	// MergeDomains lets a domain span several files, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does: the top-level
	// descriptors of every file of the domain are put together, in load
	// order, and a top-level descriptor (key and value) found in two files
	// is an error. Without it, two files with the same domain are an error.
	MergeDomains bool
}

// Load reads the limits file at path or, when path is a directory, every
// *.yaml and *.yml file in it and in its subdirectories at any depth.
// A directory that has a config subdirectory is envoyproxy/ratelimit's
// runtime layout (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY, its limits in config/
// and below, other runtime keys beside it): there, as ratelimit does, only
// the files directly in it and those under config/ are read, so pointing
// Sluice at ROOT/ratelimit or at ROOT/ratelimit/config reads the same
// files. Names that start with a dot are skipped (that also skips the
// ..data links of a Kubernetes ConfigMap volume); symlinks are followed,
// to at most maxDirDepth directories down. The files are checked together: each is
// one domain and no two may have the same domain. A directory with no such
// file is an error.
func Load(path string) (*Config, error) {
	return LoadOptions{}.Load(path)
}

// Load is Load with the options o.
func (o LoadOptions) Load(path string) (*Config, error) {
	srcs, err := readSources(path)
	if err != nil {
		return nil, err
	}
	return build(srcs, o)
}

// readSources reads the file or the directory's limits files, sorted by
// path.
func readSources(path string) ([]source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, ioError(path, "cannot read the limits path", err)
	}
	if !fi.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, ioError(path, "cannot read the limits file", err)
		}
		return []source{{name: path, data: data}}, nil
	}
	srcs, err := readDir(path, nil, 0)
	if err != nil {
		return nil, err
	}
	if len(srcs) == 0 {
		return nil, &Error{File: path, Reason: "the directory has no *.yaml or *.yml file, nor a subdirectory holding some; add one file per domain"}
	}
	return srcs, nil
}

// maxDirDepth bounds how deep Load reads directories, so that a symlink to a
// parent directory is an error rather than a loop.
const maxDirDepth = 16

// readDir appends the limits files of dir and of its subdirectories to
// srcs, in name order (a subdirectory's files where its name sorts); depth
// is how far dir is below the path Load was given.
func readDir(dir string, srcs []source, depth int) ([]source, error) {
	if depth > maxDirDepth {
		return nil, &Error{File: dir, Reason: fmt.Sprintf("more than %d directories deep (a symlink loop?)", maxDirDepth)}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, ioError(dir, "cannot list the limits directory", err)
	}
	// envoyproxy/ratelimit's runtime layout: its limits are under config/.
	runtimeRoot := false
	if depth == 0 {
		if fi, err := os.Stat(filepath.Join(dir, "config")); err == nil && fi.IsDir() {
			runtimeRoot = true
		}
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p) // follows symlinks
		if err != nil {
			return nil, ioError(p, "cannot read the limits file", err)
		}
		if fi.IsDir() {
			if runtimeRoot && name != "config" {
				continue
			}
			if srcs, err = readDir(p, srcs, depth+1); err != nil {
				return nil, err
			}
			continue
		}
		if ext := strings.ToLower(filepath.Ext(name)); ext != ".yaml" && ext != ".yml" {
			continue
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, ioError(p, "cannot read the limits file", err)
		}
		srcs = append(srcs, source{name: p, data: data})
	}
	return srcs, nil
}

// ioError reports err, dropping the path an *fs.PathError repeats.
func ioError(path, what string, err error) *Error {
	cause := err
	var pe *fs.PathError
	if errors.As(err, &pe) {
		cause = pe.Err
	}
	return &Error{File: path, Reason: what + ": " + cause.Error(), Err: err}
}

// fingerprint digests the sources' names and contents.
func fingerprint(srcs []source) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, s := range srcs {
		binary.BigEndian.PutUint64(n[:], uint64(len(s.name)))
		h.Write(n[:])
		h.Write([]byte(s.name))
		binary.BigEndian.PutUint64(n[:], uint64(len(s.data)))
		h.Write(n[:])
		h.Write(s.data)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// build parses the sources into one Config.
func build(srcs []source, o LoadOptions) (*Config, error) {
	var ps problems
	c := &Config{domains: make(map[string]*domain)}
	for _, s := range srcs {
		c.files = append(c.files, s.name)
		p := &parser{file: s.name, ps: &ps, budget: nodeBudget(len(s.data))}
		if o.MergeDomains {
			p.merge = func(name string) *domain { return c.domains[name] }
		}
		first := len(ps.list)
		d := p.parseFile(s.data)
		ps.sortFrom(first)
		if d == nil {
			continue
		}
		if prev, dup := c.domains[d.name]; dup {
			if prev != d { // d == prev: this file was merged into it
				ps.add(&Error{File: s.name, Line: d.line, Reason: fmt.Sprintf(
					"domain %q is already defined in %s:%d; each domain must be in exactly one file, so merge the two files, or let domains span files with --merge-domain-config",
					d.name, prev.file, prev.line)})
			}
			continue
		}
		c.domains[d.name] = d
	}
	for _, name := range slices.Sorted(maps.Keys(c.domains)) {
		checkReplaces(c.domains[name], &ps)
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	for name := range c.domains {
		c.names = append(c.names, name)
	}
	slices.Sort(c.names)
	sum := fingerprint(srcs)
	c.version = hex.EncodeToString(sum[:8])
	return c, nil
}

// nodeBudget bounds the YAML nodes a file of n bytes may make the parser
// visit, so that aliases (which let a file expand exponentially, or in a
// cycle) cannot make a load run away. A file without aliases has fewer
// nodes than bytes; the budget leaves room to reuse blocks through
// aliases many times over.
func nodeBudget(n int) int { return 16*n + 1<<16 }

// maxDepth bounds how deeply descriptors nest. Envoy descriptors have a
// handful of entries; a deeper tree can only be a mistake (or an alias
// cycle).
const maxDepth = 64

// maxPathValue bounds how much of a key or value Rule.Path repeats.
const maxPathValue = 128

// errBudget is panicked when a file exceeds its node budget and recovered by
// parseFile.
type errBudget struct{}

// parser checks one file. Problems go to ps; parsing goes on after a
// problem, so that one load reports as many as it can.
type parser struct {
	file   string
	ps     *problems
	budget int
	// merge, when domains may span files, returns the domain of that name
	// that earlier files defined, or nil.
	merge func(name string) *domain
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.ps.add(&Error{File: p.file, Line: line, Reason: fmt.Sprintf(format, args...)})
}

// spend counts one visited node.
func (p *parser) spend() {
	p.budget--
	if p.budget < 0 {
		panic(errBudget{})
	}
}

// deref follows aliases to the node they name.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode {
		p.spend()
		if n.Alias == nil {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
		}
		n = n.Alias
	}
	return n
}

// parseFile parses one file into its domain, or returns nil after
// reporting why it cannot.
func (p *parser) parseFile(data []byte) (d *domain) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(errBudget); !ok {
				panic(r)
			}
			p.errorf(nil, "the file expands to too many YAML nodes through aliases; write it out without anchors and aliases")
			d = nil
		}
	}()

	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			p.errorf(nil, "the file is empty; it needs a domain and a list of descriptors")
		} else {
			p.ps.add(syntaxError(p.file, err))
		}
		return nil
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == io.EOF:
	case err != nil:
		p.ps.add(syntaxError(p.file, err))
		return nil
	case !isNull(docRoot(&extra)):
		p.errorf(docRoot(&extra), "a second YAML document starts here; a file holds one domain, so put each domain in its own file")
		return nil
	}

	root := docRoot(&doc)
	if isNull(root) {
		p.errorf(root, "the file is empty; it needs a domain and a list of descriptors")
		return nil
	}
	root = p.deref(root)
	fields, ok := p.fields(root, &topLevel)
	if !ok {
		return nil
	}
	d = &domain{file: p.file, line: root.Line}
	df, hasDomain := fields.get("domain")
	if hasDomain {
		d.name, ok = p.str(df)
		if !ok {
			return nil
		}
		d.line = df.key.Line
	}
	if d.name == "" && !fields.unknown {
		at := root
		if hasDomain {
			at = df.key
		}
		p.errorf(at, "the file has no domain; add domain: <name>, the domain Envoy sends in its rate limit requests")
		return nil
	}
	if d.name == "" {
		return nil
	}
	if p.merge != nil {
		if prev := p.merge(d.name); prev != nil {
			d = prev // this file's descriptors join the domain's
		}
	}
	if f, ok := fields.get("descriptors"); ok {
		p.descriptors(f.val, &d.root, d, "domain="+d.name+" ", nil, 1)
	}
	return d
}

// docRoot returns a document's content node, or a null node for an empty
// document.
func docRoot(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: doc.Line, Column: doc.Column}
		}
		return doc.Content[0]
	}
	return doc
}

func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// descriptors parses a list of descriptors into the children of parent;
// prefix starts the Path of the rules found and stat holds the statistics
// key levels above the list; depth is the list's level, 1 at the top.
func (p *parser) descriptors(list *yaml.Node, parent *node, d *domain, prefix string, stat []statLevel, depth int) {
	p.spend()
	list = p.deref(list)
	if isNull(list) {
		return
	}
	if depth > maxDepth {
		p.errorf(list, "descriptors nest more than %d levels deep; Envoy descriptors have far fewer entries (is an alias referring to itself?)", maxDepth)
		return
	}
	if list.Kind != yaml.SequenceNode {
		p.errorf(list, "descriptors must be a list of descriptors, each starting with - key:, found %s", describe(list))
		return
	}
	seen := make(map[Entry]int)
	for _, item := range list.Content {
		p.spend()
		item = p.deref(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item, "a descriptor must be a mapping with at least a key, found %s", describe(item))
			continue
		}
		fields, ok := p.fields(item, &descriptorLevel)
		if !ok {
			continue
		}
		var e Entry
		kf, hasKey := fields.get("key")
		if hasKey {
			if e.Key, ok = p.str(kf); !ok {
				continue
			}
		}
		if e.Key == "" {
			if fields.unknown {
				continue
			}
			p.errorf(item, "the descriptor has no key; add key: <descriptor key>, the key Envoy sends in its descriptor entry")
			continue
		}
		if strings.Contains(e.Key, "*") {
			p.errorf(kf.val, "key %q has a '*': wildcards are only supported in value; write the key exactly as Envoy sends it", clip(e.Key))
			continue
		}
		if vf, ok := fields.get("value"); ok {
			if e.Value, ok = p.str(vf); !ok {
				continue
			}
		}
		if first, dup := seen[e]; dup {
			p.errorf(item, "duplicate descriptor %s at this level (first on line %d); merge the two into one", describeEntry(e), first)
			continue
		}
		seen[e] = item.Line
		if depth == 1 {
			if at, dup := d.top[e]; dup && at.file != p.file {
				p.errorf(item, "descriptor %s is also at the top of domain %q in %s:%d; a domain that spans files may not repeat a top-level descriptor, so merge the two into one",
					describeEntry(e), d.name, at.file, at.line)
				continue
			}
			if d.top == nil {
				d.top = make(map[Entry]position)
			}
			d.top[e] = position{p.file, item.Line}
		}

		n := &node{}
		here := prefix + describeEntry(e)
		var rule *Rule
		if f, ok := fields.get("rate_limit"); ok {
			rule = p.rateLimit(f)
		}
		flag := func(name string) bool {
			f, ok := fields.get(name)
			if !ok {
				return false
			}
			b, _ := p.boolean(f)
			return b
		}
		shadow, quota, detailed := flag("shadow_mode"), flag("quota_mode"), flag("detailed_metric")
		valueToMetric := flag("value_to_metric")
		if flag("share_threshold") {
			if strings.Contains(e.Value, "*") {
				n.share = e.Value
			} else {
				p.errorf(fields.m["share_threshold"].key,
					"share_threshold needs a wildcard value (one with a '*'), but this descriptor's value is %q; remove share_threshold or use a wildcard value", clip(e.Value))
			}
		}
		var meta *structpb.Struct
		if f, ok := fields.get("metadata"); ok {
			meta = p.metadata(f)
		}
		// This level of the statistics key: the value shows when the
		// descriptor has one that is not a pattern; value_to_metric shows
		// the request's instead of none or of a pattern (unless the
		// pattern's values share one counter).
		level := statLevel{key: e.Key, fixed: e.Value, shared: n.share != ""}
		level.fromRequest = valueToMetric && (e.Value == "" || strings.Contains(e.Value, "*") && !level.shared)
		stat := append(stat[:len(stat):len(stat)], level)
		if f, ok := fields.get("usage"); ok && rule == nil && flag("usage") {
			p.errorf(f.key, "usage applies to the descriptor's own rate_limit, and this descriptor has none; put usage: true next to the rate_limit of the descriptors whose hits are reported after the fact")
		}
		if f, ok := fields.get("lease"); ok && rule == nil && flag("lease") {
			p.errorf(f.key, "lease applies to the descriptor's own rate_limit, and this descriptor has none; put lease: true next to the rate_limit of a hot key")
		}
		if rule != nil {
			rule.ShadowMode, rule.QuotaMode, rule.DetailedMetric = shadow, quota, detailed
			rule.Usage = flag("usage")
			rule.Lease = flag("lease")
			if rule.Lease && rule.Usage {
				f, _ := fields.get("lease")
				p.errorf(f.key, "lease and usage do not go together: usage is reported after the fact, a lease is spent before it; drop one")
			}
			rule.Metadata = meta
			rule.Domain, rule.Path, rule.File, rule.Line = d.name, here, p.file, item.Line
			rule.StatKey, rule.statLevels = staticStatKey(stat), ruleStatLevels(stat, detailed)
			n.rule = rule
			d.rules = append(d.rules, rule)
		}
		if f, ok := fields.get("descriptors"); ok {
			p.descriptors(f.val, n, d, here+" > ", stat, depth+1)
		}

		parent.hasChildren = true
		if e.Value == "" {
			if parent.byKey == nil {
				parent.byKey = make(map[string]*node)
			}
			parent.byKey[e.Key] = n
			continue
		}
		if parent.exact == nil {
			parent.exact = make(map[Entry]*node)
		}
		parent.exact[e] = n
		if strings.Contains(e.Value, "*") {
			parts := strings.Split(e.Value, "*")
			w := &wildcard{parts: parts, node: n}
			for _, s := range parts {
				w.minLen += len(s)
			}
			if parent.wild == nil {
				parent.wild = make(map[string][]*wildcard)
			}
			parent.wild[e.Key] = append(parent.wild[e.Key], w)
		}
	}
}

// ruleStatLevels returns the levels of a rule's statistics key when some
// come from the request, nil otherwise. detailed (the rule's
// detailed_metric) shows the request's value at every level but those of
// a shared wildcard, which show their pattern.
func ruleStatLevels(stat []statLevel, detailed bool) []statLevel {
	out := slices.Clone(stat)
	fromRequest := false
	for i := range out {
		l := &out[i]
		if detailed && !l.shared {
			l.fromRequest = true
		}
		fromRequest = fromRequest || l.fromRequest
	}
	if !fromRequest {
		return nil
	}
	return out
}

// describeEntry names a descriptor's key and value for messages.
func describeEntry(e Entry) string {
	if e.Value == "" {
		return "key=" + clip(e.Key)
	}
	return "key=" + clip(e.Key) + " value=" + clip(e.Value)
}

// clip shortens s for messages.
func clip(s string) string {
	if len(s) > maxPathValue {
		return s[:maxPathValue] + "..."
	}
	return s
}

// rateLimit parses a rate_limit block into a Rule, or returns nil after
// reporting why it cannot.
func (p *parser) rateLimit(f field) *Rule {
	if isNull(f.val) {
		p.errorf(f.key, "rate_limit is empty; give it unit and requests_per_unit, or unlimited: true, or remove it")
		return nil
	}
	fields, ok := p.fields(f.val, &rateLimitLevel)
	if !ok {
		return nil
	}
	r := &Rule{}
	good := true
	// checkMissing is whether to report a missing unit or
	// requests_per_unit: not when a misspelled field may be it, nor when
	// unlimited is unreadable (the rule may not need them).
	checkMissing := !fields.unknown
	if uf, ok := fields.get("unlimited"); ok {
		r.Unlimited, ok = p.boolean(uf)
		good = good && ok
		checkMissing = checkMissing && ok
	}
	unitF, hasUnit := fields.get("unit")
	var unit string
	if hasUnit {
		unit, ok = p.str(unitF)
		good = good && ok
	}
	rpuF, hasRPU := fields.get("requests_per_unit")
	if hasRPU && isNull(rpuF.val) {
		hasRPU = false
	}
	if r.Unlimited {
		if unit != "" {
			p.errorf(unitF.key, "an unlimited rate_limit takes no unit; remove unit, or remove unlimited: true to enforce the limit")
			good = false
		}
		if hasRPU {
			if n, ok := p.uint32(rpuF); ok && n != 0 {
				p.errorf(rpuF.key, "an unlimited rate_limit takes no requests_per_unit; remove requests_per_unit, or remove unlimited: true to enforce the limit")
				good = false
			}
		}
	} else {
		switch u, known := parseUnit(unit); {
		case unit == "" && !checkMissing:
			good = false
		case unit == "":
			at := f.val
			if hasUnit {
				at = unitF.key
			}
			p.errorf(at, "rate_limit has no unit; add unit: %s", unitChoices)
			good = false
		case !known:
			p.errorf(unitF.val, "unknown unit %q (want %s)", clip(unit), unitChoices)
			good = false
		default:
			r.Unit, r.Window = u, u.Duration()
		}
		if hasRPU {
			n, ok := p.uint32(rpuF)
			r.Limit = int64(n)
			good = good && ok
		} else {
			at := f.val
			if rf, ok := fields.get("requests_per_unit"); ok {
				at = rf.key
			}
			if checkMissing {
				p.errorf(at, "rate_limit has no requests_per_unit; add requests_per_unit: <count> (0 blocks every request)")
			}
			good = false
		}
	}
	if nf, ok := fields.get("name"); ok {
		r.Name, ok = p.str(nf)
		good = good && ok
	}
	if rf, ok := fields.get("replaces"); ok {
		r.Replaces, r.replacesAt, ok = p.replaces(rf, r.Name)
		good = good && ok
	}
	if !good {
		return nil
	}
	return r
}

// replaces parses rate_limit.replaces, a list of {name: ...}, into the
// names and the line of each.
func (p *parser) replaces(f field, self string) ([]string, []int, bool) {
	if isNull(f.val) {
		return nil, nil, true
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.val, "replaces must be a list of - name: <rate_limit name>, found %s", describe(f.val))
		return nil, nil, false
	}
	var names []string
	var lines []int
	good := true
	for _, item := range f.val.Content {
		p.spend()
		item = p.deref(item)
		if item.Kind == yaml.ScalarNode && !isNull(item) {
			p.errorf(item, "a replaces entry is a mapping: write - name: %s", clip(item.Value))
			good = false
			continue
		}
		fields, ok := p.fields(item, &replacesLevel)
		if !ok {
			good = false
			continue
		}
		var name string
		if nf, ok := fields.get("name"); ok {
			if name, ok = p.str(nf); !ok {
				good = false
				continue
			}
		}
		switch {
		case name == "" && fields.unknown:
			good = false
		case name == "":
			p.errorf(item, "a replaces entry has no name; write - name: <the name of the rate_limit to replace>")
			good = false
		case name == self:
			p.errorf(item, "rate_limit %q lists itself in replaces; remove that entry", clip(self))
			good = false
		default:
			names, lines = append(names, name), append(lines, item.Line)
		}
	}
	return names, lines, good
}

// checkReplaces reports each replaces entry that names no rate_limit of
// its domain: ApplyReplaces would never drop anything for it, and a name
// mistyped there would leave two limits in force where one was meant.
func checkReplaces(d *domain, ps *problems) {
	named := make(map[string]bool)
	for _, r := range d.rules {
		if r.Name != "" {
			named[r.Name] = true
		}
	}
	for _, r := range d.rules {
		for i, name := range r.Replaces {
			if !named[name] {
				ps.add(&Error{File: r.File, Line: r.replacesAt[i], Reason: fmt.Sprintf(
					"replaces names %q, but no rate_limit of domain %q has that name; correct it, or give the rate_limit it means name: %s",
					clip(name), clip(d.name), clip(name))})
			}
		}
	}
}

// metadata parses a descriptor's metadata into a protobuf Struct, as
// envoyproxy/ratelimit does.
func (p *parser) metadata(f field) *structpb.Struct {
	if isNull(f.val) {
		return nil
	}
	if f.val.Kind != yaml.MappingNode {
		p.errorf(f.val, "metadata must be a mapping, found %s", describe(f.val))
		return nil
	}
	s, err := structpb.NewStruct(p.plain(f.val).(map[string]any))
	if err != nil {
		p.errorf(f.val, "metadata cannot be sent to Envoy: %v", err)
		return nil
	}
	return s
}

// plain turns a YAML node into the values structpb takes, reading scalars
// as envoyproxy/ratelimit's YAML 1.1 parser does: timestamps stay text,
// yes/no and on/off are booleans, and mapping keys are text.
func (p *parser) plain(n *yaml.Node) any {
	p.spend()
	n = p.deref(n)
	switch n.Kind {
	case yaml.MappingNode:
		own, merged := p.pairs(n)
		m := make(map[string]any, len(own)+len(merged))
		for _, kv := range own {
			m[p.deref(kv[0]).Value] = p.plain(kv[1])
		}
		for _, kv := range merged {
			if k := p.deref(kv[0]).Value; !hasKey(m, k) {
				m[k] = p.plain(kv[1])
			}
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, len(n.Content))
		for i, e := range n.Content {
			l[i] = p.plain(e)
		}
		return l
	case yaml.ScalarNode:
		quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
		if b, ok := yaml11Bools[n.Value]; ok && !quoted {
			return b
		}
		switch n.ShortTag() {
		case "!!null":
			return nil
		case "!!int":
			var i int64
			if n.Decode(&i) == nil {
				return i
			}
			var u uint64
			if n.Decode(&u) == nil {
				return u
			}
		case "!!float":
			var f float64
			if n.Decode(&f) == nil {
				return f
			}
		}
		return n.Value
	}
	return nil
}

func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}

// str returns a scalar field's text; null is "".
func (p *parser) str(f field) (string, bool) {
	v := f.val
	if v.Kind != yaml.ScalarNode {
		p.errorf(v, "%s must be a string, found %s", f.name, describe(v))
		return "", false
	}
	if v.ShortTag() == "!!null" {
		return "", true
	}
	return v.Value, true
}

// boolean returns a boolean field; null is false. Like
// envoyproxy/ratelimit's YAML 1.1 parser, it takes yes/no, on/off and y/n
// as well as true/false, unquoted.
func (p *parser) boolean(f field) (bool, bool) {
	v := f.val
	if isNull(v) {
		return false, true
	}
	if v.Kind == yaml.ScalarNode && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		if b, ok := yaml11Bools[v.Value]; ok {
			return b, true
		}
	}
	p.errorf(v, "%s must be true or false, found %s", f.name, describe(v))
	return false, false
}

// yaml11Bools are the words YAML 1.1 reads as booleans.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
	"true": true, "True": true, "TRUE": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false,
	"false": false, "False": false, "FALSE": false, "off": false, "Off": false, "OFF": false,
}

// uint32 returns a field that must be a whole number from 0 to 2^32-1.
func (p *parser) uint32(f field) (uint32, bool) {
	v := f.val
	var n uint32
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&n) != nil {
		p.errorf(v, "%s must be a whole number from 0 to 4294967295, found %s", f.name, describe(v))
		return 0, false
	}
	return n, true
}

// describe names a node for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		s := n.Value
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return strconv.Quote(s)
	}
	return "nothing"
}
