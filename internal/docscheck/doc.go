// Package docscheck holds a test that compiles the Go examples shown in
// README.md and docs/*.md. It has no code of its own.
package docscheck
