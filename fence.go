package fencelock

import (
	"strconv"
	"strings"
)

// The fencing token's format and guarantees are documented in GUARANTEES.md
// ("Fencing tokens"); the acquire script (acquire.lua) issues it.

// parseValue splits a lock's value, "<token> <fence> <owner>"; the owner may
// be missing, or contain spaces.
func parseValue(v string) (token string, fence int64, owner string) {
	token, rest, _ := strings.Cut(v, " ")
	f, owner, _ := strings.Cut(rest, " ")
	fence, _ = strconv.ParseInt(f, 10, 64)
	return token, fence, owner
}
