// Package glob escapes text for Redis's glob-style patterns: SCAN's MATCH,
// and an ACL's key (~) and channel (&) patterns.
package glob

import "strings"

// Escape escapes the characters Redis reads as a glob (* ? [ ] \) with a
// backslash, so that Escape(s)+"*" matches what begins with s, and only
// that.
func Escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
