package fencelock

import (
	"fmt"
	"strconv"
)

// The fencing token's format and guarantees are documented in doc.go; the
// acquire script (acquire.lua) issues it.

// decodeAcquire decodes the acquire script's reply {ok, value}: value is the
// fence, as a decimal string, when ok is 1 and the holder's PTTL in
// milliseconds when ok is 0.
func decodeAcquire(reply any) (ok bool, value int64, err error) {
	arr, isArr := reply.([]any)
	if !isArr || len(arr) != 2 {
		return false, 0, fmt.Errorf("unexpected acquire reply %v", reply)
	}
	switch flag, _ := arr[0].(int64); flag {
	case 0:
		pttl, isInt := arr[1].(int64)
		if !isInt {
			return false, 0, fmt.Errorf("unexpected acquire reply %v", reply)
		}
		return false, pttl, nil
	case 1:
		s, isStr := arr[1].(string)
		fence, err := strconv.ParseInt(s, 10, 64)
		if !isStr || err != nil || fence <= 0 {
			return false, 0, fmt.Errorf("unexpected fence in acquire reply %v", reply)
		}
		return true, fence, nil
	}
	return false, 0, fmt.Errorf("unexpected acquire reply %v", reply)
}
