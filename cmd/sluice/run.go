package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Exit codes of the binary; the package documentation explains them.
const (
	exitOK     = 0
	exitError  = 1
	exitDenied = 2
)

// exitCodeError ends a command with code. err, if not nil, is printed
// first.
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

func (e *exitCodeError) Unwrap() error { return e.err }

// cli is what the commands of one run share: where they write and where
// they read the environment.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// run runs the sluice command line args (without the program name) and
// returns the exit code. ctx ends serve gracefully and cancels client
// calls; getenv reads the environment (os.Getenv in main). It never calls
// os.Exit, so tests run it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdout: stdout, stderr: stderr, getenv: getenv}
	root := c.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	name := "sluice"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	code := exitError
	var ce *exitCodeError
	if errors.As(err, &ce) {
		code, err = ce.code, ce.err
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
	}
	return code
}

// rootCommand builds the command tree.
func (c *cli) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Sluice is a distributed, exact rate-limit service",
		Long: `Sluice is a distributed, exact rate-limit service.

Run a node with "sluice serve"; ask it for decisions and look at or change
its state with the other commands, which talk gRPC to --addr.

Every flag of serve and edge, and the connection flags of the other commands, also
read the environment variable SLUICE_<FLAG> (--data-dir: SLUICE_DATA_DIR);
the command line wins.

Exit codes: 0 success (check: allowed), 1 error, 2 check denied,
128+N serve stopped by a second signal N.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd.Flags(), c.getenv)
		},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())
	})
	root.CompletionOptions.HiddenDefaultCmd = true
	root.AddCommand(
		c.serveCommand(),
		c.checkCommand(),
		c.keyCommand(),
		c.overrideCommand(),
		c.membersCommand(),
		c.topCommand(),
		c.benchCommand(),
		c.limitsCommand(),
		c.dataCommand(),
		c.edgeCommand(),
		c.versionCommand(),
	)
	return root
}
