// Package fencerueidis runs fencelock's Locker on a rueidis client
// (github.com/redis/rueidis): New for one deployment (a server, a
// Sentinel-managed master, a Cluster), NewRedlock for a quorum of them.
//
// Locks are the same locks whichever client takes them: the keys, the
// scripts and the wake-up channels are fencelock's, so a process on go-redis
// and one on rueidis exclude each other and wake each other's waiters. The
// Locker works as it does on go-redis (see the fencelock package), with these
// differences, which come from what a rueidis client shows of itself:
//
//   - every call stops at its context's deadline, whatever the client's own
//     timeouts (rueidis does so itself);
//   - an error cannot name why a dial failed after the context ended:
//     rueidis's dialer is the user's (ClientOption.DialCtxFn), which an
//     adapter cannot hook, so a call to an unreachable server returns the
//     dial's own error, or the context's;
//   - wake-up channels are named as on database 0: rueidis does not show a
//     client's SelectDB. Locks on another database are still correct, and
//     this adapter's waiters wake each other, but a go-redis waiter on a
//     database other than 0 is not woken by this adapter's releases (nor the
//     reverse): it polls.
//
// This module has its own go.mod, so that a go-redis user never downloads
// rueidis.
package fencerueidis
