module github.com/fencelock/fencelock/chaos

go 1.26.8

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/fencelock/fencelock v0.1.0
	github.com/fencelock/fencelock/rueidis v0.1.0
	github.com/fencelock/fencelock/valkeygo v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.80
	github.com/valkey-io/valkey-go v1.0.80
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/fencelock/fencelock => ../

replace github.com/fencelock/fencelock/rueidis => ../rueidis

replace github.com/fencelock/fencelock/valkeygo => ../valkeygo
