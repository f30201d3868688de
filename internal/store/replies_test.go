package store

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAcquireReply(t *testing.T) {
	for _, tc := range []struct {
		reply   any
		ok      bool
		val     int64
		wantErr bool
	}{
		{[]any{int64(1), "42"}, true, 42, false},
		{[]any{int64(1), "9223372036854775807"}, true, 9223372036854775807, false},
		{[]any{int64(0), int64(1500), "pod-2 (pid 7)"}, false, 1500, false},
		{[]any{int64(0), int64(-1), ""}, false, -1, false},
		{[]any{int64(0), int64(1500)}, false, 0, true},
		{[]any{int64(1), "0"}, false, 0, true},
		{[]any{int64(1), "x"}, false, 0, true},
		{[]any{int64(1), int64(42)}, false, 0, true},
		{[]any{int64(0), "1500", ""}, false, 0, true},
		{[]any{int64(2)}, false, 0, true},
		{[]any{int64(2), "1"}, false, 0, true},
		{[]any{int64(1)}, false, 0, true},
		{"OK", false, 0, true},
	} {
		a := AcquireReply("acquire", tc.reply)
		if tc.wantErr {
			assert.Error(t, a.Err, "%v", tc.reply)
			continue
		}
		require.NoError(t, a.Err)
		assert.Equal(t, tc.ok, a.OK)
		if a.OK {
			assert.Equal(t, tc.val, a.Fence)
		} else {
			assert.Equal(t, tc.val, int64(a.Busy.TTL/time.Millisecond))
		}
	}
}

func TestIsUnknownCommand(t *testing.T) {
	for _, tc := range []struct {
		reply string
		want  bool
	}{
		{"ERR unknown command 'ssubscribe', with args beginning with: 'lock:{x}'", true},
		{"ERR Unknown subcommand or wrong number of arguments for 'shardnumsub'. Try PUBSUB HELP.", true}, // Redis 6.2
		{"NOPERM this user has no permissions to access the 'lock:{x}' channel", false},
		{"MOVED 1234 127.0.0.1:7001", false},
	} {
		assert.Equal(t, tc.want, IsUnknownCommand(errors.New(tc.reply)), tc.reply)
	}
}
