//go:build race

package benchmarks

func init() { raceEnabled = true }
