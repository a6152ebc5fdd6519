package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// CleanPath returns escaped, a request's URL path as sent (URL.EscapedPath),
// in the one form that rules should match and that an origin should
// receive, so that a path written another way cannot walk around a rule
// written for it. It applies RFC 3986's normalisations (section 6.2.2) and
// what common origins (nginx, Go's ServeMux, Python's http.server) do
// besides:
//
//   - percent-encoded unreserved characters (letters, digits, '-', '.',
//     '_', '~') are decoded ("/%6Cogin" is "/login"), other encodings keep
//     their encoding, in upper-case hex;
//   - runs of slashes are merged ("//login" is "/login");
//   - dot segments are resolved, after that decoding ("/./login",
//     "/x/../login", "/%2e/login" and "/../login" are "/login"); a path that
//     ends in a slash or a dot segment keeps one final slash.
//
// Case is kept: paths are case-sensitive (RFC 3986, and nginx and Python's
// http.server serve /LOGIN as another resource than /login). An origin
// that folds case needs a rule that does too (the edge's route option
// path_case_insensitive).
//
// It refuses, with an error that says why, what origins read in different
// ways: an encoded slash or backslash ("%2F", "%5C": one segment or two?),
// a raw backslash (a slash to some servers), a NUL or another control
// character, encoded or not, a malformed encoding, and a path that does not
// start with a slash. The edge and ServeNext answer those 400.
func CleanPath(escaped string) (string, error) {
	if escaped == "" {
		return "/", nil
	}
	if escaped[0] != '/' {
		return "", errors.New("the path does not start with a slash")
	}
	// Decode what may be decoded and check the rest, byte by byte.
	var b strings.Builder
	b.Grow(len(escaped))
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		switch {
		case c == '%':
			if i+2 >= len(escaped) || unhex(escaped[i+1]) < 0 || unhex(escaped[i+2]) < 0 {
				return "", fmt.Errorf("malformed percent-encoding at byte %d", i)
			}
			d := byte(unhex(escaped[i+1])<<4 | unhex(escaped[i+2]))
			i += 2
			switch {
			case d == '/' || d == '\\':
				return "", fmt.Errorf("an encoded %q, which origins read as a separator or not", d)
			case d < 0x20 || d == 0x7f:
				return "", fmt.Errorf("an encoded control character %#x", d)
			case unreserved(d):
				b.WriteByte(d)
			default:
				fmt.Fprintf(&b, "%%%02X", d)
			}
		case c == '\\':
			return "", errors.New("a backslash, which some origins read as a slash")
		case c < 0x20 || c == 0x7f:
			return "", fmt.Errorf("a control character %#x", c)
		default:
			b.WriteByte(c)
		}
	}
	// Merge slashes and resolve dot segments (RFC 3986 section 5.2.4).
	segs := strings.Split(b.String()[1:], "/")
	out := make([]string, 0, len(segs))
	trailing := false
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case "", ".":
			trailing = last
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			trailing = last
		default:
			out = append(out, s)
			trailing = false
		}
	}
	clean := "/" + strings.Join(out, "/")
	if trailing && len(out) > 0 {
		clean += "/"
	}
	return clean, nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// CleanRequest returns r with its URL path replaced by CleanPath's form
// (r itself if it is in that form already), or CleanPath's error.
func CleanRequest(r *http.Request) (*http.Request, error) {
	escaped := r.URL.EscapedPath()
	clean, err := CleanPath(escaped)
	if err != nil || clean == escaped {
		return r, err
	}
	path, err := url.PathUnescape(clean)
	if err != nil {
		return r, err // not reached: CleanPath checked every encoding
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = path, clean
	return r2, nil
}

// BadPath answers 400 to a request whose path CleanPath refused with err,
// as ServeNext does.
func BadPath(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusBadRequest)
	fmt.Fprintf(w, "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":%q}\n", "ambiguous request path: "+err.Error())
}
