package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

func (c *cli) membersCommand() *cobra.Command {
	co := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's members as one node sees them (admin API)",
		Long: `List the cluster's members as the node at --addr sees them: the live
ones and the last ones seen dead or left, with their gossip and gRPC
addresses, their state and the share of keys each owns in that node's
view. A node outside a cluster lists itself, owning every key.

States: alive; leaving (handing its keys over before it stops; it owns no
more keys); left (stopped gracefully, or forgotten); dead (failure
detection gave up on it; it still owns its keys, which wait for it under
--owner-policy exact, or go to the next node once it is fenced under
available).

The footer gives the node's view epoch: it increases with every change
that node sees. Ask two nodes and compare their lists to see whether they
agree; their epochs are not comparable.`,
		Example: `  sluice members --addr sluice.sluice.svc:8081
  sluice members -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			ctx, cancel := cl.callContext(cmd.Context())
			defer cancel()
			resp, err := cl.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
			if err != nil {
				return cl.callError(err)
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			if err := printMembers(cmd.OutOrStdout(), resp); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "as seen by %s at epoch %d\n", resp.Node, resp.Epoch)
			return nil
		},
	}
	co.register(cmd.PersistentFlags())
	cmd.AddCommand(membersForgetCommand(co))
	return cmd
}

func membersForgetCommand(co *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "forget NAME",
		Short: "Remove a member that is down for good from the cluster (admin API)",
		Long: `Remove the member NAME, which is down and will not come back (its
machine and disk are gone), from every live node's roster. Until then its
keys wait for it under --owner-policy exact; once it is forgotten they go to
the other nodes WITHOUT the state it held: each may allow up to one more
window's limit. A member that is alive is refused: stop it, or let it leave
(SIGTERM hands its keys over). If a forgotten member comes back, it joins
again.`,
		Example: `  sluice members forget sluice-4`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			ctx, cancel := cl.callContext(cmd.Context())
			defer cancel()
			resp, err := cl.admin.ForgetMember(ctx, &sluicepb.ForgetMemberRequest{Name: args[0]})
			if err != nil {
				return cl.callError(err)
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "forgot %s on %s\n", fmtText(args[0]), strings.Join(resp.Nodes, ", "))
			return nil
		},
	}
}

// printMembers writes the members as a table, one per line, sorted by name
// as the server sends them.
func printMembers(w io.Writer, resp *sluicepb.ListMembersResponse) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "NAME\tSTATE\tGRPC\tGOSSIP\tSHARE")
	for _, m := range resp.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f%%\n",
			fmtText(m.Name), m.State, orDash(m.GrpcAddr), orDash(m.GossipAddr), 100*m.Share)
	}
	return tw.Flush()
}

// orDash shows an empty cell as "-", so that tables keep their columns.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return fmtText(s)
}
