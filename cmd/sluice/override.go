package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/api"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

func (c *cli) overrideCommand() *cobra.Command {
	co := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "override",
		Short: "Change the limit of a key or a key prefix without a deploy (admin API)",
		Long: `Overrides replace the limit, window or algorithm of the keys they match,
whatever their checks or the limits file say. They take effect on the next
check of each key, without a restart, and survive restarts. An exact-key
override beats any prefix override; among prefix overrides the longest
prefix wins.`,
	}
	co.register(cmd.PersistentFlags())
	cmd.AddCommand(overrideSetCommand(co), overrideListCommand(co), overrideRmCommand(co))
	return cmd
}

func overrideSetCommand(co *clientOptions) *cobra.Command {
	var (
		ko        keyOptions
		prefix    bool
		limit     int64
		window    time.Duration
		algorithm string
		expiresIn time.Duration
		expiresAt string
		note      string
	)
	cmd := &cobra.Command{
		Use:   "set KEY",
		Short: "Create or replace the override of a key (or, with --prefix, of every key starting with KEY)",
		Example: `  sluice override set tenant:42 --limit 1000 --window 1m --expires-in 2h --note "INC-123: raise during migration"
  sluice override set tenant: --prefix --limit 10 --window 1s`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o := &sluicepb.Override{
				Prefix:    prefix,
				Limit:     limit,
				Algorithm: protoAlgorithm(algorithm),
				Note:      note,
			}
			if window != 0 {
				o.Window = durationpb.New(window)
			}
			switch {
			case cmd.Flags().Changed("expires-in"):
				if expiresIn <= 0 {
					return fmt.Errorf("--expires-in %v: want a positive duration", expiresIn)
				}
				o.ExpiresAt = timestamppb.New(time.Now().Add(expiresIn))
			case expiresAt != "":
				t, err := time.Parse(time.RFC3339, expiresAt)
				if err != nil {
					return fmt.Errorf("--expires-at %q: want an RFC 3339 time such as 2026-12-01T18:00:00Z", expiresAt)
				}
				o.ExpiresAt = timestamppb.New(t)
			}
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			if o.Key, err = ko.key(cmd.Context(), cl, args); err != nil {
				return err
			}
			ctx, cancel := cl.callContext(cmd.Context())
			defer cancel()
			resp, err := cl.admin.SetOverride(ctx, &sluicepb.SetOverrideRequest{Override: o})
			if err != nil {
				return cl.callError(err)
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printOverrides(cmd.OutOrStdout(), []*sluicepb.Override{resp.Override})
		},
	}
	ko.register(cmd)
	fs := cmd.Flags()
	fs.BoolVar(&prefix, "prefix", false, "apply to every key that starts with KEY, not just KEY")
	fs.Int64Var(&limit, "limit", 0, "hits allowed per window (0: keep the check's)")
	fs.Var(newDurationValue(&window, 0), "window", "the window, e.g. 1s, 1m, 1h, 7d (0: keep the check's)")
	fs.Var(newEnumValue(&algorithm, "", algorithmNames...), "algorithm", "the algorithm (default: keep the check's)")
	fs.Var(newDurationValue(&expiresIn, 0), "expires-in", "stop applying after this long (default: never)")
	fs.StringVar(&expiresAt, "expires-at", "", "stop applying at this RFC 3339 time (default: never)")
	fs.StringVar(&note, "note", "", "free text for people: why, who, which ticket")
	cmd.MarkFlagsMutuallyExclusive("expires-in", "expires-at")
	return cmd
}

// printOverrides writes overrides as a table.
func printOverrides(w io.Writer, list []*sluicepb.Override) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tMATCH\tLIMIT\tWINDOW\tALGORITHM\tEXPIRES AT\tSET AT\tNOTE")
	for _, o := range list {
		match := "exact"
		if o.Prefix {
			match = "prefix"
		}
		limit := "-"
		if o.Limit != 0 {
			limit = fmt.Sprint(o.Limit)
		}
		expires := "never"
		if o.ExpiresAt != nil {
			expires = fmtTime(o.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", api.PrintableKey(o.Key), match, limit,
			fmtDuration(o.Window), algorithmName(o.Algorithm), expires, fmtTime(o.SetAt), fmtText(o.Note))
	}
	return tw.Flush()
}

func overrideListCommand(co *clientOptions) *cobra.Command {
	var (
		prefix    string
		escaped   bool
		pageSize  int32
		pageToken string
		all       bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the overrides in force, in byte order of key",
		Example: `  sluice override list
  sluice override list --prefix tenant: -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := escapedValue(escaped, prefix)
			if err != nil {
				return err
			}
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			req := &sluicepb.ListOverridesRequest{Prefix: p, PageSize: pageSize, PageToken: pageToken}
			out := &sluicepb.ListOverridesResponse{}
			err = pages(cmd.Context(), cl, all, &req.PageToken, func(ctx context.Context) (string, error) {
				resp, err := cl.admin.ListOverrides(ctx, req)
				if err != nil {
					return "", err
				}
				out.Overrides = append(out.Overrides, resp.Overrides...)
				out.NextPageToken = resp.NextPageToken
				return resp.NextPageToken, nil
			})
			if err != nil {
				return err
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			if len(out.Overrides) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no overrides found")
			} else if err := printOverrides(cmd.OutOrStdout(), out.Overrides); err != nil {
				return err
			}
			morePages(cmd, co, out.NextPageToken)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&prefix, "prefix", "", "list only the overrides whose key starts with these bytes")
	addPrefixEscaped(fs, &escaped)
	addPageFlags(cmd, &pageSize, &pageToken, &all)
	return cmd
}

func overrideRmCommand(co *clientOptions) *cobra.Command {
	var (
		ko     keyOptions
		prefix bool
	)
	cmd := &cobra.Command{
		Use:     "rm KEY",
		Aliases: []string{"delete"},
		Short:   "Remove the override of a key (with --prefix, the prefix override of KEY)",
		Long: `Remove one override. The keys it matched go back to the next matching
override, or to what their checks and the limits file say, from their next
check on, without losing their hits. Removing an override that does not
exist is not an error (exit code 0); the output says so.`,
		Example: `  sluice override rm tenant:42
  sluice override rm tenant: --prefix`,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			key, err := ko.key(cmd.Context(), cl, args)
			if err != nil {
				return err
			}
			ctx, cancel := cl.callContext(cmd.Context())
			defer cancel()
			resp, err := cl.admin.DeleteOverride(ctx, &sluicepb.DeleteOverrideRequest{Key: key, Prefix: prefix})
			if err != nil {
				return cl.callError(err)
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			kind := "exact-key"
			if prefix {
				kind = "prefix"
			}
			if resp.Existed {
				fmt.Fprintf(cmd.OutOrStdout(), "removed the %s override of %s\n", kind, api.PrintableKey(key))
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "no %s override of %s; nothing removed\n", kind, api.PrintableKey(key))
			}
			return nil
		},
	}
	ko.register(cmd)
	cmd.Flags().BoolVar(&prefix, "prefix", false, "remove the prefix override of KEY rather than its exact-key override")
	return cmd
}
