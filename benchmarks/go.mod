module github.com/fencelock/fencelock/benchmarks

go 1.26.8

replace github.com/fencelock/fencelock => ../

replace github.com/fencelock/fencelock/rueidis => ../rueidis

require (
	github.com/bsm/redislock v0.9.4
	github.com/fencelock/fencelock v0.1.0
	github.com/fencelock/fencelock/rueidis v0.1.0
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.80
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)
