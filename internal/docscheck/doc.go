// Package docscheck holds the tests of the Go examples shown in README.md
// and docs/*.md: one compiles them all, one runs README.md's Quick start in
// two processes holding the day's lock in turn, with a forced release
// between them, and checks that the day is settled once. It has no code of
// its own.
package docscheck
