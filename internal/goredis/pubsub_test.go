package goredis

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

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
