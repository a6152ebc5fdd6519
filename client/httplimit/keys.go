package httplimit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// Key says what a rule counts requests by: a value taken from the request.
// A request for which the key has no value (a header it does not send, a
// form without the field) is not counted by the rule: pair such a rule
// with one that always applies, such as ClientIP.
type Key struct {
	name   string
	secret bool // values are hashed (Secret)
	fn     func(r *http.Request, x *extract) (string, bool)
}

// String describes the key, as the rules file writes it.
func (k Key) String() string { return k.name }

// IsZero reports whether k is the zero Key (no key).
func (k Key) IsZero() bool { return k.fn == nil }

// extract is what the keys of one request share: the client IP, found
// once, and the form, read once.
type extract struct {
	l      *Limiter
	ip     string
	ipDone bool
	form   map[string]string
	noForm bool
}

// Header counts by the value of a request header, for example an API key
// ("X-API-Key"). A request without it is not counted by the rule. Values
// are used as sent; a long one is hashed (see the package doc, Keys), and
// so is every value of a header whose name says it holds a credential
// (see Secret).
func Header(name string) Key {
	name = http.CanonicalHeaderKey(name)
	return secretIf(name, Key{name: "header:" + name, fn: func(r *http.Request, _ *extract) (string, bool) {
		v := r.Header.Get(name)
		return v, v != ""
	}})
}

// Secret counts by k's values hashed (SHA-256, "sha256:" and 64 hex
// digits), so that a credential used as a key (an API key, a token) never
// reaches Sluice, its data file or any log in clear: the same value still
// counts under the same key. Header, Query and Form keys whose name holds
// "key", "token", "auth", "secret", "session", "password", "credential",
// "cookie" or "signature" (in any case) are secret already; the edge's
// rules file marks others with secret: true.
func Secret(k Key) Key {
	if k.secret {
		return k
	}
	fn := k.fn
	return Key{name: k.name, secret: true, fn: func(r *http.Request, x *extract) (string, bool) {
		v, ok := fn(r, x)
		if !ok {
			return "", false
		}
		return hashValue(v), true
	}}
}

// secretIf is Secret(k) if name says it holds a credential.
func secretIf(name string, k Key) Key {
	lower := strings.ToLower(name)
	for _, w := range []string{"key", "token", "auth", "secret", "session", "password", "credential", "cookie", "signature"} {
		if strings.Contains(lower, w) {
			return Secret(k)
		}
	}
	return k
}

// IsSecret reports whether k's values are hashed (see Secret).
func (k Key) IsSecret() bool { return k.secret }

func hashValue(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ClientIP counts by the client's IP address: the connection's peer, or,
// when the peer is a trusted proxy (Config.TrustedProxies), the address
// the proxies report in Forwarded or X-Forwarded-For. IPv6 clients are
// counted by their /64 (Config.IPv6PrefixLen). Every request has one.
func ClientIP() Key {
	return Key{name: "ip", fn: func(r *http.Request, x *extract) (string, bool) {
		if !x.ipDone {
			x.ip, x.ipDone = x.l.clientKey(r), true
		}
		return x.ip, x.ip != ""
	}}
}

// Account counts by the authenticated account that fn finds in the
// request's context (put there by an authentication middleware that runs
// first). A request without one (fn returns false) is not counted by the
// rule.
func Account(fn func(ctx context.Context) (string, bool)) Key {
	return Key{name: "account", fn: func(r *http.Request, _ *extract) (string, bool) {
		return fn(r.Context())
	}}
}

// Route counts by the route: the pattern of the http.ServeMux entry that
// matched (Request.Pattern, when the middleware wraps a handler inside the
// mux), else the request path.
func Route() Key {
	return Key{name: "route", fn: func(r *http.Request, _ *extract) (string, bool) {
		if r.Pattern != "" {
			return r.Pattern, true
		}
		return cleanPath(r), true
	}}
}

// Path counts by the request path, in CleanPath's form (decoded), so that
// "//login" and "/login" count as one.
func Path() Key {
	return Key{name: "path", fn: func(r *http.Request, _ *extract) (string, bool) {
		return cleanPath(r), true
	}}
}

// cleanPath is r's path in CleanPath's form, decoded, or as it is if
// CleanPath refuses it (ServeNext answers those 400 before any key).
func cleanPath(r *http.Request) string {
	clean, err := CleanPath(r.URL.EscapedPath())
	if err != nil {
		return r.URL.Path
	}
	if p, err := url.PathUnescape(clean); err == nil {
		return p
	}
	return r.URL.Path
}

// Method counts by the request method.
func Method() Key {
	return Key{name: "method", fn: func(r *http.Request, _ *extract) (string, bool) {
		return r.Method, true
	}}
}

// Query counts by the value of a URL query parameter; a request without it
// is not counted by the rule. A parameter named like a credential
// ("api_key", "token") is hashed (see Secret).
func Query(name string) Key {
	return secretIf(name, Key{name: "query:" + name, fn: func(r *http.Request, _ *extract) (string, bool) {
		v := r.URL.Query().Get(name)
		return v, v != ""
	}})
}

// Form counts by a field of the request body: a form
// (application/x-www-form-urlencoded) or a JSON object whose field is a
// string, such as the username submitted to a login form. The value is
// trimmed and lower-cased, so that "Alice " and "alice" are one key. The
// body is read up to Config.MaxBodyBytes and given back whole to the
// handler. A request without the field, or with a larger or unreadable
// body, is not counted by the rule. A field named like a credential
// ("password", "token") is hashed (see Secret).
func Form(field string) Key {
	return secretIf(field, Key{name: "form:" + field, fn: func(r *http.Request, x *extract) (string, bool) {
		if x.form == nil && !x.noForm {
			x.form, x.noForm = x.l.readForm(r)
		}
		v := strings.ToLower(strings.TrimSpace(x.form[field]))
		return v, v != ""
	}})
}

// Const counts every request under one key: a global limit.
func Const(value string) Key {
	return Key{name: "const:" + value, fn: func(*http.Request, *extract) (string, bool) {
		return value, true
	}}
}

// Join counts by several keys together (an account per route, an API key
// per method): a request is counted only if each part has a value.
func Join(parts ...Key) Key {
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = p.name
	}
	return Key{name: strings.Join(names, "+"), fn: func(r *http.Request, x *extract) (string, bool) {
		var b strings.Builder
		for i, p := range parts {
			v, ok := p.fn(r, x)
			if !ok {
				return "", false
			}
			if i > 0 {
				b.WriteByte('+')
			}
			b.WriteString(escapePart(v))
		}
		return b.String(), true
	}}
}

// escapePart escapes a part of a joined key so that no two lists of
// parts make the same key.
func escapePart(v string) string {
	if !strings.ContainsAny(v, "+%") {
		return v
	}
	return strings.NewReplacer("%", "%25", "+", "%2B").Replace(v)
}

// maxValueLen is the longest key value used as it is; longer ones are
// replaced by their SHA-256, so that a client cannot make a key Sluice
// refuses (1024 bytes by default) or fill its memory with long ones.
const maxValueLen = 128

// sluiceKey is the key of rule on value: prefix, rule name, value.
func sluiceKey(prefix, rule, value string) string {
	if len(value) > maxValueLen {
		value = hashValue(value)
	}
	return prefix + rule + "|" + value
}

// readForm reads the fields of a form or JSON body and puts the body back
// for the handler. It reports false for a body it could not use.
func (l *Limiter) readForm(r *http.Request) (map[string]string, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/x-www-form-urlencoded" && ct != "application/json" && !strings.HasSuffix(ct, "+json") {
		return nil, true
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, l.cfg.MaxBodyBytes+1))
	// The handler gets what was read, then the rest.
	r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
	if err != nil || int64(len(buf)) > l.cfg.MaxBodyBytes {
		return nil, true
	}
	fields := map[string]string{}
	if ct == "application/x-www-form-urlencoded" {
		q, err := url.ParseQuery(string(buf))
		if err != nil {
			return nil, true
		}
		for k, v := range q {
			if len(v) > 0 {
				fields[k] = v[0]
			}
		}
		return fields, false
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(buf, &obj) != nil {
		return nil, true
	}
	for k, raw := range obj {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			fields[k] = s
		}
	}
	return fields, false
}

// readCloser reads from r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }
