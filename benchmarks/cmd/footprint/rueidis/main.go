// Command rueidis is ../fencerueidis without fencelock: a lock taken (SET NX
// PX) and released (a compare-and-delete script) on a bare rueidis client,
// the baseline of the footprint measured in README.md ("fencelock on
// rueidis").
package main

import (
	"context"

	"github.com/redis/rueidis"
)

var release = rueidis.NewLuaScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func main() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"localhost:6379"}})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx := context.Background()
	if err := client.Do(ctx, client.B().Set().Key("job").Value("token").Nx().PxMilliseconds(10000).Build()).Error(); err != nil {
		panic(err)
	}
	if err := release.Exec(ctx, client, []string{"job"}, []string{"token"}).Error(); err != nil {
		panic(err)
	}
}
