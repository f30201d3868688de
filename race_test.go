//go:build race

package fencelock

func init() { raceEnabled = true }
