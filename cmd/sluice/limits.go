package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/api/limits"
)

func (c *cli) limitsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Work with limits files offline",
	}
	var opts limits.LoadOptions
	check := &cobra.Command{
		Use:   "check PATH...",
		Short: "Check limits files (or directories of them) as sluice serve would load them",
		Long: `Check each PATH, a limits file or a directory of them (as --limits-file
takes it, envoyproxy/ratelimit's runtime layout with its config/
directory included), without a node: print one line per problem as
FILE:LINE: REASON, or PATH: ok with its domains and rules. Exit 0 when
every PATH loads, 1 otherwise: for CI pipelines that change limits.
With --merge-domain-config, a domain may span the files of a PATH, as
under sluice serve --merge-domain-config.`,
		Example: `  sluice limits check limits/
  sluice limits check /data/ratelimit edge.yaml`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, paths []string) error {
			bad := 0
			for _, p := range paths {
				cfg, err := opts.Load(p)
				if err != nil {
					bad++
					for _, line := range strings.Split(err.Error(), "\n") {
						fmt.Fprintln(cmd.OutOrStdout(), strings.TrimPrefix(line, "limits: "))
					}
					continue
				}
				rules := 0
				for _, d := range cfg.Domains() {
					rules += len(cfg.Rules(d))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok, %s (%s), %s\n", p, plural(len(cfg.Domains()), "domain", "domains"),
					strings.Join(cfg.Domains(), ", "), plural(rules, "rule", "rules"))
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d limits paths did not load", bad, len(paths))
			}
			return nil
		},
	}
	check.Flags().BoolVar(&opts.MergeDomains, "merge-domain-config", false, "let a domain span several files, as serve --merge-domain-config does")
	cmd.AddCommand(check)
	return cmd
}

// plural is n and the noun in the singular or the plural.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
