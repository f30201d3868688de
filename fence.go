package fencelock

import (
	"fmt"
	"strconv"
)

// The fencing token's format and guarantees are documented in doc.go; the
// acquire script (acquire.lua) issues it.

// decodeAcquire decodes the acquire script's reply: {1, fence} with the fence
// as a decimal string, {0, pttl} with the holder's PTTL in milliseconds, or
// {2} for a retired token, which reads as an error.
func decodeAcquire(reply any) (ok bool, value int64, err error) {
	arr, isArr := reply.([]any)
	if !isArr || len(arr) == 0 {
		return false, 0, fmt.Errorf("%w from the acquire script: %v", errReply, reply)
	}
	flag, _ := arr[0].(int64)
	switch {
	case flag == 0 && len(arr) == 2:
		pttl, isInt := arr[1].(int64)
		if isInt {
			return false, pttl, nil
		}
	case flag == 1 && len(arr) == 2:
		s, isStr := arr[1].(string)
		fence, err := strconv.ParseInt(s, 10, 64)
		if isStr && err == nil && fence > 0 {
			return true, fence, nil
		}
	case flag == 2 && len(arr) == 1:
		return false, 0, errRetired
	}
	return false, 0, fmt.Errorf("%w from the acquire script: %v", errReply, reply)
}
