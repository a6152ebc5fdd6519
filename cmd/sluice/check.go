package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/api"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// algorithmNames are the algorithms as users type them.
var algorithmNames = []string{actor.SlidingLog.String(), actor.SlidingWindow.String(), actor.TokenBucket.String()}

// protoAlgorithm maps a name of algorithmNames ("" for unspecified) to the
// proto enum.
func protoAlgorithm(name string) sluicepb.Algorithm {
	if name == "" {
		return sluicepb.Algorithm_ALGORITHM_UNSPECIFIED
	}
	return sluicepb.Algorithm(sluicepb.Algorithm_value["ALGORITHM_"+strings.ToUpper(name)])
}

// algorithmName is the inverse of protoAlgorithm; "-" for unspecified.
func algorithmName(a sluicepb.Algorithm) string {
	if a == sluicepb.Algorithm_ALGORITHM_UNSPECIFIED {
		return "-"
	}
	return strings.ToLower(strings.TrimPrefix(a.String(), "ALGORITHM_"))
}

func (c *cli) checkCommand() *cobra.Command {
	var (
		co        clientOptions
		ko        keyOptions
		limit     int64
		window    time.Duration
		cost      int64
		algorithm string
		peek      bool
		refund    bool
		penalty   bool
	)
	cmd := &cobra.Command{
		Use:   "check KEY",
		Short: "Ask for one decision: do --cost hits on KEY fit in --limit per --window?",
		Long: `Ask the node for one decision, recording the hits when they fit.

Exit code: 0 when allowed, 2 when denied, 1 on any error, so that scripts
can branch on it:

    if sluice check "user:42" --limit 10 --window 1m >/dev/null; then ...

--limit and --window may be left out when an override or the node's limits
file gives them. An override always wins over the values sent.`,
		Example: `  sluice check user:42 --limit 10 --window 1m
  sluice check user:42 --limit 10 --window 1m --peek -o json
  sluice check --envoy edge remote_address=10.0.0.1 --limit 100 --window 1s`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if peek && cmd.Flags().Changed("cost") {
				return fmt.Errorf("--peek is --cost 0: give one of them")
			}
			if cmd.Flags().Changed("window") && window <= 0 {
				return fmt.Errorf("--window %v: want a positive duration (leave --window out to take the window from an override or the limits file)", window)
			}
			// A refund retried after a failure that applied it would give
			// back twice.
			co.noRetry = refund
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			key, err := ko.key(cmd.Context(), cl, args)
			if err != nil {
				return err
			}
			chk := &sluicepb.Check{
				Key:       key,
				Limit:     limit,
				Algorithm: protoAlgorithm(algorithm),
				Refund:    refund,
				Penalty:   penalty,
			}
			if window != 0 {
				chk.Window = durationpb.New(window)
			}
			switch {
			case peek:
				chk.Cost = proto.Int64(0)
			case cmd.Flags().Changed("cost"):
				chk.Cost = proto.Int64(cost)
			}
			ctx, cancel := cl.callContext(cmd.Context())
			defer cancel()
			resp, err := cl.rl.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{chk}})
			if err != nil {
				if err := missingFlags(err, key, cmd.Flags()); err != nil {
					return err
				}
				return cl.callError(err)
			}
			if len(resp.Decisions) != 1 {
				return fmt.Errorf("the server sent %d decisions for 1 check", len(resp.Decisions))
			}
			d := resp.Decisions[0]
			if d.ErrorCode != 0 {
				// Not decided (a damaged record): an error, not a denial.
				return cl.callError(status.Error(codes.Code(d.ErrorCode), d.ErrorMessage))
			}
			if err := printDecision(cmd, &co, key, d); err != nil {
				return err
			}
			if !d.Allowed {
				return &exitCodeError{code: exitDenied}
			}
			return nil
		},
	}
	ko.register(cmd)
	fs := cmd.Flags()
	fs.Int64Var(&limit, "limit", 0, "hits allowed per window (left out: from an override or the limits file)")
	fs.Var(newDurationValue(&window, 0), "window", "length of the sliding window, e.g. 1s, 1m, 1h, 7d (left out: from an override or the limits file)")
	fs.Int64Var(&cost, "cost", 1, "hits to record")
	fs.Var(newEnumValue(&algorithm, "", algorithmNames...), "algorithm", "counting algorithm (default: an override's or the limits file's, else sliding_log)")
	fs.BoolVar(&peek, "peek", false, "decide without recording anything (--cost 0)")
	fs.BoolVar(&refund, "refund", false, "give --cost hits back instead of taking them")
	fs.BoolVar(&penalty, "penalty", false, "record the hits even if denied")
	co.register(fs)
	return cmd
}

// missingFlags turns the node's refusal of a check without a limit or a
// window (an errdetails.BadRequest naming checks[0].limit or
// checks[0].window) into the flags to give, nil for any other error.
// fs says which flags were given.
func missingFlags(err error, key []byte, fs *pflag.FlagSet) error {
	var limit, window bool
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				limit = limit || v.Field == "checks[0].limit"
				window = window || v.Field == "checks[0].window"
			}
		}
	}
	var missing, want string
	switch {
	case limit && window:
		missing, want = "--limit and --window are required", "a limit and a window"
	case window && fs.Changed("limit"):
		missing, want = "--window is required with --limit", "a window"
	case window:
		missing, want = "--window is required", "a window"
	case limit && fs.Changed("window"):
		missing, want = "--limit is required with --window", "a limit"
	case limit:
		missing, want = "--limit is required", "a limit"
	default:
		return nil
	}
	return fmt.Errorf("%s: no override or limits file entry gives key %s %s (see sluice check --help)", missing, api.PrintableKey(key), want)
}

func printDecision(cmd *cobra.Command, co *clientOptions, key []byte, d *sluicepb.Decision) error {
	w := cmd.OutOrStdout()
	if co.json() {
		return printJSON(w, d)
	}
	result := "allowed"
	if !d.Allowed {
		result = "denied"
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tRESULT\tLIMIT\tREMAINING\tRETRY AFTER\tRESET AFTER\tNODE")
	fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", api.PrintableKey(key), result, d.Limit, d.Remaining,
		fmtDuration(d.RetryAfter), fmtDuration(d.ResetAfter), d.Node)
	return tw.Flush()
}
