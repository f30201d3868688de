package fencelock

import "fmt"

// The fencing token's format and guarantees are documented in doc.go; the
// acquire script (acquire.lua) issues it.

// decodeAcquire decodes the acquire script's reply {ok, value}: value is the
// fence when ok is 1 and the holder's PTTL in milliseconds when ok is 0.
func decodeAcquire(reply any) (ok bool, value int64, err error) {
	arr, isArr := reply.([]any)
	if !isArr || len(arr) != 2 {
		return false, 0, fmt.Errorf("unexpected acquire reply %v", reply)
	}
	flag, ok1 := arr[0].(int64)
	val, ok2 := arr[1].(int64)
	if !ok1 || !ok2 || (flag != 0 && flag != 1) {
		return false, 0, fmt.Errorf("unexpected acquire reply %v", reply)
	}
	if flag == 1 && val <= 0 {
		return false, 0, fmt.Errorf("unexpected fence %d", val)
	}
	return flag == 1, val, nil
}
