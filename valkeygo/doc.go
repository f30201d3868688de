// Package fencevalkey runs fencelock's Locker on a valkey-go client
// (github.com/valkey-io/valkey-go): New for one deployment (a server, a
// Sentinel-managed master, a Cluster), NewRedlock for a quorum of them.
//
// Locks are the same locks whichever client takes them: the keys, the
// scripts and the wake-up channels are fencelock's, so a process on go-redis
// and one on valkey-go exclude each other and wake each other's waiters. The
// Locker works as it does on go-redis (see the fencelock package), with these
// differences, which come from what a valkey-go client shows of itself:
//
//   - every call stops at its context's deadline, whatever the client's own
//     timeouts (valkey-go does so itself);
//   - an error cannot name why a dial failed after the context ended:
//     valkey-go's dialer is the user's (ClientOption.DialCtxFn), which an
//     adapter cannot hook, so a call to an unreachable server returns the
//     dial's own error, or the context's;
//   - wake-up channels are named as on database 0: valkey-go does not show a
//     client's SelectDB. Locks on another database are still correct, and
//     this adapter's waiters wake each other, but a go-redis waiter on a
//     database other than 0 is not woken by this adapter's releases (nor the
//     reverse): it polls.
//
// This module has its own go.mod, so that a go-redis user never downloads
// valkey-go. Its code is a port of fencerueidis's (valkey-go is a fork of
// rueidis with the same API): keep the two the same.
package fencevalkey
