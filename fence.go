package fencelock

import (
	"fmt"
	"strconv"
	"strings"
)

// The fencing token's format and guarantees are documented in GUARANTEES.md
// ("Fencing tokens"); the acquire script (acquire.lua) issues it.

// decodeAcquire decodes the acquire script's reply: {1, fence} with the fence
// as a decimal string, {0, pttl, owner} with the holder's PTTL in
// milliseconds and its owner, or {2} for a retired token, which reads as an
// error.
func decodeAcquire(reply any) (ok bool, value int64, owner string, err error) {
	arr, isArr := reply.([]any)
	if !isArr || len(arr) == 0 {
		return false, 0, "", fmt.Errorf("%w from the acquire script: %v", errReply, reply)
	}
	flag, _ := arr[0].(int64)
	switch {
	case flag == 0 && len(arr) == 3:
		pttl, isInt := arr[1].(int64)
		owner, isStr := arr[2].(string)
		if isInt && isStr {
			return false, pttl, owner, nil
		}
	case flag == 1 && len(arr) == 2:
		s, isStr := arr[1].(string)
		fence, err := strconv.ParseInt(s, 10, 64)
		if isStr && err == nil && fence > 0 {
			return true, fence, "", nil
		}
	case flag == 2 && len(arr) == 1:
		return false, 0, "", errRetired
	}
	return false, 0, "", fmt.Errorf("%w from the acquire script: %v", errReply, reply)
}

// parseValue splits a lock's value, "<token> <fence> <owner>"; the owner may
// be missing, or contain spaces.
func parseValue(v string) (token string, fence int64, owner string) {
	token, rest, _ := strings.Cut(v, " ")
	f, owner, _ := strings.Cut(rest, " ")
	fence, _ = strconv.ParseInt(f, 10, 64)
	return token, fence, owner
}
