package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/persist"
)

func (c *cli) dataCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Work with a node's data file offline",
	}
	verify := &cobra.Command{
		Use:   "verify DIR",
		Short: "List every damaged page and record of the data file in DIR, read-only",
		Long: `Read DIR/sluice.db (the --data-dir of a stopped node) without changing
it and print one line per damaged page (a meta page, or a subtree of the
file that cannot be walked) and per damaged record (its key, quoted, and
why its state cannot be decoded), then a summary. Exit 0 when nothing is
damaged, 1 otherwise. WAL files are not read.

Stop the node first: verify does not take the file's lock. A damaged record
costs its key only on a running node (its checks answer DATA_LOSS);
"sluice key reset KEY" clears it.`,
		Example: `  sluice data verify /var/lib/sluice`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := filepath.Join(args[0], "sluice.db")
			rep, err := persist.Verify(path, func(_ string, value []byte) error {
				return actor.CheckStored(value)
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, p := range rep.Pages {
				fmt.Fprintf(out, "damaged page: %s\n", p)
			}
			for _, r := range rep.Damaged {
				fmt.Fprintf(out, "damaged record: key %s: %s\n", actor.QuoteKey(r.Key), r.Reason)
			}
			fmt.Fprintf(out, "%s: %d records read, %d damaged pages, %d damaged records\n", path, rep.Records, len(rep.Pages), len(rep.Damaged))
			if !rep.OK() {
				return &exitCodeError{code: exitError}
			}
			return nil
		},
	}
	cmd.AddCommand(verify)
	return cmd
}
