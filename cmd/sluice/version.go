package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is the release, set at build time with
// -ldflags "-X main.version=v1.2.3". Empty means: the module version from
// the build info, "(devel)" for a build from a work tree.
var version string

// versionInfo describes the binary.
type versionInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Modified bool   `json:"modified"`
	Go       string `json:"go"`
}

// buildVersion reads the version from the linker flag and the build info.
func buildVersion() versionInfo {
	v := versionInfo{Version: version, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

func (c *cli) versionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, the commit and the Go version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildVersion()
			w := cmd.OutOrStdout()
			if output == "json" {
				b, err := json.MarshalIndent(v, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(w, "%s\n", b)
				return err
			}
			commit := v.Commit
			if v.Modified {
				commit += " (modified)"
			}
			tw := newTable(w)
			fmt.Fprintf(tw, "version\t%s\ncommit\t%s\ngo\t%s\n", v.Version, commit, v.Go)
			return tw.Flush()
		},
	}
	cmd.Flags().VarP(newEnumValue(&output, "table", "table", "json"), "output", "o", "output format")
	bindEnv(cmd.Flags(), "output")
	return cmd
}
