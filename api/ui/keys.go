package ui

import (
	"fmt"
	"strings"
)

// printable shows a key for people as the CLI and the admin API do:
// printable ASCII as it is, a backslash as \\, every other byte as \xNN.
// The pages link to a key by this form; parseKey reads it back.
func printable(key []byte) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(key))
	for _, c := range key {
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c >= 0x20 && c <= 0x7e:
			b.WriteByte(c)
		default:
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
	}
	return b.String()
}

// parseKey reads a key in printable's form: \\ is a backslash, \xNN a byte
// (either case), anything else as it is.
func parseKey(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x' && isHex(s[i+2]) && isHex(s[i+3]):
			out = append(out, unhex(s[i+2])<<4|unhex(s[i+3]))
			i += 3
		default:
			return nil, fmt.Errorf("key: a backslash at byte %d starts neither \\\\ nor \\xNN", i)
		}
	}
	return out, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
