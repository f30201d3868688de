package fencelock

import "fmt"

// Fencing tokens
//
// Every successful acquisition of a lock name gets a fencing token (see
// Lease.Fence) issued by the acquire script in the same atomic step that sets
// the lock. Pass it to every write the critical section makes to a shared
// resource, and have the resource refuse a write whose token is not greater
// than the greatest it has accepted, for example
//
//	UPDATE settlements SET ..., fence_token = @fence
//	WHERE settle_date = @date AND fence_token < @fence
//
// A holder that was paused or partitioned past its TTL then has its stale
// writes rejected, which the lock alone cannot promise.
//
// Format. A fence is a positive int64 (store it as BIGINT). For each lock
// name it is max(previous fence + 1, server time in microseconds since the
// Unix epoch), kept in the counter key KeyPrefix+"{"+name+"}:fence". The time
// floor comes from the Redis server's TIME, never from a client's clock, so
// fences stay strictly increasing per name even when the counter key is lost
// (evicted under maxmemory, flushed, or missing after a failover to a replica
// that had not received it), provided the server clocks do not step back by
// more than the time between two acquisitions of the name. Fences of
// different names are unrelated.
//
// Memory. The counter key has no expiry: it costs one small string key per
// lock name ever acquired (about 70 bytes as reported by MEMORY USAGE on
// Redis 7; see TestFenceCounterMemory). Deleting counters of names no longer
// used is safe, because of the time floor.

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
