package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/api"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// maxPages bounds --all, in case a server keeps answering with a next page.
const maxPages = 1_000_000

func (c *cli) keyCommand() *cobra.Command {
	co := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Look at, list and reset live key state (admin API)",
	}
	co.register(cmd.PersistentFlags())
	cmd.AddCommand(keyGetCommand(co), keyListCommand(co), keyResetCommand(co), keyEnvoyCommand(co))
	return cmd
}

func keyGetCommand(co *clientOptions) *cobra.Command {
	var ko keyOptions
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show a key's live state: its counts, hits, and when it resets",
		Example: `  sluice key get user:42
  sluice key get --envoy edge remote_address=10.0.0.1
  sluice key get -o json user:42`,
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
			resp, err := cl.admin.GetKey(ctx, &sluicepb.GetKeyRequest{Key: key})
			if err != nil {
				return cl.callError(err)
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printKeyState(cmd.OutOrStdout(), resp.GetState())
		},
	}
	ko.register(cmd)
	return cmd
}

// printKeyState writes a key's state as a two-column table, then its
// sliding log, if any.
func printKeyState(w io.Writer, s *sluicepb.KeyState) error {
	tw := newTable(w)
	row := func(name, format string, args ...any) { fmt.Fprintf(tw, name+"\t"+format+"\n", args...) }
	row("key", "%s", api.PrintableKey(s.Key))
	row("found", "%s", fmtBool(s.Found))
	if s.Found {
		row("algorithm", "%s", algorithmName(s.Algorithm))
		row("limit", "%d", s.Limit)
		row("window", "%s", fmtDuration(s.Window))
		row("used", "%d", s.Used)
		row("remaining", "%d", s.Remaining)
		row("retry after", "%s", fmtDuration(s.RetryAfter))
		row("reset after", "%s", fmtDuration(s.ResetAfter))
		row("expires at", "%s", fmtTime(s.ExpiresAt))
		row("in memory", "%s", fmtBool(s.InMemory))
		if s.Reservations > 0 {
			row("reservations", "%d, %d hits", s.Reservations, s.Reserved)
			row("lease denials", "%d", s.LeaseDenials)
		}
		switch ctr := s.Counters.(type) {
		case *sluicepb.KeyState_SlidingWindow:
			row("bucket start", "%s", fmtTime(ctr.SlidingWindow.BucketStart))
			row("previous bucket", "%d", ctr.SlidingWindow.Previous)
			row("current bucket", "%d", ctr.SlidingWindow.Current)
		case *sluicepb.KeyState_TokenBucket:
			row("tokens", "%.3f", ctr.TokenBucket.Tokens)
			row("tokens updated", "%s", fmtTime(ctr.TokenBucket.Updated))
		}
	}
	row("node", "%s", s.Node)
	row("read at", "%s", fmtTime(s.ReadAt))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.Holders) > 0 {
		fmt.Fprintln(w)
		tw = newTable(w)
		fmt.Fprintln(tw, "HOLDER	RESERVATIONS	LEASES	HITS	LAST EXPIRES	DEMAND	SHARE	LEASED")
		for _, h := range s.Holders {
			name := h.Holder
			if name == "" {
				name = "-"
			}
			demand, share := "-", "-"
			if h.Demand > 0 {
				demand, share = strconv.FormatInt(h.Demand, 10), "all"
			}
			if h.Share > 0 {
				share = strconv.FormatInt(h.Share, 10)
			}
			fmt.Fprintf(tw, "%s	%d	%d	%d	%s	%s	%s	%d\n", name, h.Reservations, h.Leases, h.Hits, fmtTime(h.ExpiresAt), demand, share, h.Leased)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if log := s.GetSlidingLog(); s.Found && log != nil {
		fmt.Fprintln(w)
		tw = newTable(w)
		fmt.Fprintln(tw, "HIT TIME\tHITS")
		for _, r := range log.Runs {
			fmt.Fprintf(tw, "%s\t%d\n", fmtTime(r.Time), r.Count)
		}
		return tw.Flush()
	}
	return nil
}

func keyListCommand(co *clientOptions) *cobra.Command {
	var (
		prefix    string
		escaped   bool
		pageSize  int32
		pageToken string
		all       bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the keys that hold state, in byte order",
		Example: `  sluice key list --prefix tenant:42:
  sluice key list --all -o json`,
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
			req := &sluicepb.ListKeysRequest{Prefix: p, PageSize: pageSize, PageToken: pageToken}
			out := &sluicepb.ListKeysResponse{}
			err = pages(cmd.Context(), cl, all, &req.PageToken, func(ctx context.Context) (string, error) {
				resp, err := cl.admin.ListKeys(ctx, req)
				if err != nil {
					return "", err
				}
				out.Keys = append(out.Keys, resp.Keys...)
				out.NextPageToken = resp.NextPageToken
				return resp.NextPageToken, nil
			})
			if err != nil {
				return err
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			if len(out.Keys) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no keys found")
			} else {
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "KEY\tIN MEMORY\tEXPIRES AT\tNODE")
				for _, k := range out.Keys {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", api.PrintableKey(k.Key), fmtBool(k.InMemory), fmtTime(k.ExpiresAt), k.Node)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			morePages(cmd, co, out.NextPageToken)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&prefix, "prefix", "", "list only the keys that start with these bytes")
	addPrefixEscaped(fs, &escaped)
	addPageFlags(cmd, &pageSize, &pageToken, &all)
	return cmd
}

// addPageFlags adds --page-size, --page-token and --all to a list command.
func addPageFlags(cmd *cobra.Command, size *int32, token *string, all *bool) {
	fs := cmd.Flags()
	fs.Int32Var(size, "page-size", 0, "most entries per call (0: the server's default, 100)")
	fs.StringVar(token, "page-token", "", "start at this page: the token a previous listing printed")
	fs.BoolVar(all, "all", false, "fetch every page")
}

// pages calls fetch once, or with all until the last page, setting *token
// to the token of the page to fetch.
func pages(ctx context.Context, cl *client, all bool, token *string, fetch func(context.Context) (next string, err error)) error {
	for range maxPages {
		callCtx, cancel := cl.callContext(ctx)
		next, err := fetch(callCtx)
		cancel()
		if err != nil {
			return cl.callError(err)
		}
		if !all || next == "" {
			return nil
		}
		if next == *token {
			return fmt.Errorf("the server sent the same page token %q twice", next)
		}
		*token = next
	}
	return fmt.Errorf("more than %d pages; stopped", maxPages)
}

// morePages tells people, on stderr, how to get the next page.
func morePages(cmd *cobra.Command, co *clientOptions, next string) {
	if next != "" && !co.json() {
		fmt.Fprintf(cmd.ErrOrStderr(), "more follow: add --all, or --page-token %q for the next page\n", next)
	}
}

func keyResetCommand(co *clientOptions) *cobra.Command {
	var ko keyOptions
	cmd := &cobra.Command{
		Use:   "reset KEY",
		Short: "Forget every hit recorded on a key (overrides are kept)",
		Example: `  sluice key reset user:42
  sluice key reset --envoy edge remote_address=10.0.0.1`,
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
			resp, err := cl.admin.ResetKey(ctx, &sluicepb.ResetKeyRequest{Key: key})
			if err != nil {
				return cl.callError(err)
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			if resp.Existed {
				fmt.Fprintf(cmd.OutOrStdout(), "reset %s\n", api.PrintableKey(key))
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s held no state; nothing to reset\n", api.PrintableKey(key))
			}
			return nil
		},
	}
	ko.register(cmd)
	return cmd
}

func keyEnvoyCommand(co *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "envoy DOMAIN KEY=VALUE...",
		Short: "Print the key Sluice counts an Envoy descriptor under",
		Long: `Print the key Sluice counts an Envoy rate-limit descriptor under. Such
keys are printable ASCII, so one can be passed on as it is:

    sluice key get "$(sluice key envoy edge remote_address=10.0.0.1)"

or, in one step, "sluice key get --envoy edge remote_address=10.0.0.1".`,
		Example: `  sluice key envoy edge remote_address=10.0.0.1
  sluice key envoy edge generic_key=api path=/search -o json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("want a DOMAIN and the descriptor's entries: DOMAIN key=value ...")
			}
			_, err := descriptorEntries(args[1:])
			return err
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			resp, err := cl.envoyKey(cmd.Context(), args[0], args[1:])
			if err != nil {
				return err
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			fmt.Fprintln(cmd.OutOrStdout(), api.PrintableKey(resp.Key))
			return nil
		},
	}
}
