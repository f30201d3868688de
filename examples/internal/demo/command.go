package demo

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Command is an example's command: what its main runs, and what its tests
// run when they run the command (demotest.Main).
type Command struct {
	// Name prefixes the error Run returns on stderr: "settlement: ...".
	Name string
	// Run tells the story. Its context is cancelled by Ctrl-C or SIGTERM;
	// Run then stops its children and removes what it created before
	// returning.
	Run func(ctx context.Context) error
	// Child is the main function of the example's child processes, from
	// ChildMain; nil if it starts none.
	Child func() int
}

// Main runs the command and returns its exit code: Child in a child process
// that Procs.Start started, Run otherwise.
func (c Command) Main() int {
	if IsChild() {
		if c.Child == nil {
			fmt.Fprintf(os.Stderr, "%s: %s is set, but the command starts no child processes\n", c.Name, childEnv)
			return 1
		}
		return c.Child()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", c.Name, err)
		return 1
	}
	return 0
}
