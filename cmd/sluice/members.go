package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

func (c *cli) membersCommand() *cobra.Command {
	co := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's members (admin API)",
		Long: `List the members of the cluster map (kept in Raft) as the node at
--addr applied it: each member's state, epoch, Raft role, gRPC and gossip
addresses, and the share of keys it acts for. A node outside a cluster
lists itself, owning every key.

States: alive (its epoch is live and gossip sees it); leaving (handing its
keys over before it stops, with --replicas 1); dead (its epoch ended, or
gossip lost it); left (forgotten); joining (gossip sees it, the map does not
list it yet). COPIES says, for a member whose epoch ended, whether its keys
went on from complete copies (yes) or wait for it (no, under --owner-policy
exact). ROLE is leader, voter or - (a non-voter).

The footer gives the cluster ID, the map version the node applied (every
node applies the same versions in the same order) and the leader.`,
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
			if resp.ClusterId == "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "as seen by %s, which is not in a cluster (or has not joined it yet)\n", resp.Node)
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "cluster %s, map version %d as applied by %s, leader %s\n",
				resp.ClusterId, resp.MapVersion, resp.Node, orDash(resp.Leader))
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
machine and disk are gone), from the cluster map, through the Raft leader.
Its epoch is ended first, once its lease is over for sure (a paused node
cannot wake up and decide). Then its keys go on: from their standbys'
copies when those are complete; otherwise, since the state it held is
gone, whichever node decides them (a replacement, or a member that joins
or comes back later, included) denies them for one window of each key's
limit, so that no window ever allows more than its limit. A member gossip
sees alive is refused: stop it first. If a forgotten member comes back, it
joins again as a new member.`,
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
			how := "its keys go on from their standbys' copies"
			if !resp.FromCopies {
				how = "its keys had no complete copy: they are denied for one window of their limit"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "forgot %s: %s\n", fmtText(args[0]), how)
			return nil
		},
	}
}

// printMembers writes the members as a table, one per line, sorted by name
// as the server sends them.
func printMembers(w io.Writer, resp *sluicepb.ListMembersResponse) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "NAME\tSTATE\tEPOCH\tROLE\tCOPIES\tGRPC\tGOSSIP\tSHARE")
	for _, m := range resp.Members {
		role := "-"
		switch {
		case m.Leader:
			role = "leader"
		case m.Voter:
			role = "voter"
		}
		copies := "-"
		if !m.Live && m.Epoch > 0 {
			copies = map[bool]string{true: "yes", false: "no"}[m.Releasable]
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.1f%%\n",
			fmtText(m.Name), m.State, m.Epoch, role, copies, orDash(m.GrpcAddr), orDash(m.GossipAddr), 100*m.Share)
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
