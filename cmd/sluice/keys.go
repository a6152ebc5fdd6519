package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/api"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// unescapeKey reads a key in the form api.PrintableKey writes (the CLI
// prints keys that way).
func unescapeKey(s string) ([]byte, error) {
	key, err := api.ParseKey(s)
	if err != nil {
		return nil, fmt.Errorf("escaped key %q: %w", s, err)
	}
	return key, nil
}

// keyOptions say how a command's arguments name a key: literally, escaped
// (--escaped), or as an Envoy descriptor (--envoy DOMAIN key=value ...).
type keyOptions struct {
	escaped bool
	envoy   string
}

// register adds --escaped and --envoy to cmd, and makes cmd check its
// arguments against them.
func (k *keyOptions) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&k.escaped, "escaped", false, `read KEY in the form sluice prints keys in: \\ for a backslash, \xNN for any byte`)
	fs.StringVar(&k.envoy, "envoy", "", "act on the key Sluice counts an Envoy descriptor of this domain under; the arguments are the descriptor's entries, key=value ...")
	cmd.MarkFlagsMutuallyExclusive("escaped", "envoy")
	cmd.Args = k.args
}

// args checks the arguments: one KEY, or with --envoy the entries.
func (k *keyOptions) args(_ *cobra.Command, args []string) error {
	if k.envoy != "" {
		_, err := descriptorEntries(args)
		return err
	}
	if len(args) != 1 {
		return fmt.Errorf("want one KEY argument, got %d (or --envoy DOMAIN key=value ...)", len(args))
	}
	return nil
}

// key returns the key the arguments name, asking the node for the key of
// an Envoy descriptor.
func (k *keyOptions) key(ctx context.Context, c *client, args []string) ([]byte, error) {
	switch {
	case k.envoy != "":
		resp, err := c.envoyKey(ctx, k.envoy, args)
		if err != nil {
			return nil, err
		}
		return resp.Key, nil
	case k.escaped:
		return unescapeKey(args[0])
	}
	return []byte(args[0]), nil
}

// escapedValue applies --escaped to a flag value (a prefix) rather than
// an argument.
func escapedValue(escaped bool, s string) ([]byte, error) {
	if escaped {
		return unescapeKey(s)
	}
	return []byte(s), nil
}

// descriptorEntries parses Envoy descriptor entries written key=value.
func descriptorEntries(args []string) ([]*sluicepb.DescriptorEntry, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("want the descriptor's entries as arguments: key=value ...")
	}
	entries := make([]*sluicepb.DescriptorEntry, len(args))
	for i, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor entry %q: want key=value (the value may be empty)", a)
		}
		entries[i] = &sluicepb.DescriptorEntry{Key: k, Value: v}
	}
	return entries, nil
}

// envoyKey asks the node for the key of an Envoy descriptor.
func (c *client) envoyKey(ctx context.Context, domain string, args []string) (*sluicepb.EnvoyKeyResponse, error) {
	entries, err := descriptorEntries(args)
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	resp, err := c.admin.EnvoyKey(ctx, &sluicepb.EnvoyKeyRequest{Domain: domain, Entries: entries})
	if err != nil {
		return nil, c.callError(err)
	}
	return resp, nil
}

// addPrefixEscaped registers --escaped for commands whose only key is the
// --prefix flag.
func addPrefixEscaped(fs *pflag.FlagSet, p *bool) {
	fs.BoolVar(p, "escaped", false, `read --prefix in the form sluice prints keys in: \\ for a backslash, \xNN for any byte`)
}
