package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// envAnnotation marks the flags that read an environment variable; its
// value is the variable's name.
const envAnnotation = "sluice_env"

// envName is the variable flag reads: SLUICE_ and the flag's name in upper
// case with dashes as underscores.
func envName(flag string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindEnv makes the named flags of fs read their environment variables
// (see applyEnv) and names the variable in their help.
func bindEnv(fs *pflag.FlagSet, names ...string) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic("sluice: bindEnv: no flag --" + name)
		}
		env := envName(name)
		if err := fs.SetAnnotation(name, envAnnotation, []string{env}); err != nil {
			panic(err)
		}
		f.Usage += " [$" + env + "]"
	}
}

// bindAllEnv is bindEnv on every flag of fs.
func bindAllEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) { bindEnv(fs, f.Name) })
}

// applyEnv sets every flag of fs that reads a variable, and was not given
// on the command line, from that variable when it is set and not empty. A
// value that does not parse is an error naming the variable.
func applyEnv(fs *pflag.FlagSet, getenv func(string) string) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		vars := f.Annotations[envAnnotation]
		if len(vars) == 0 || f.Changed {
			return
		}
		v := getenv(vars[0])
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q: invalid value for --%s: %v", vars[0], v, f.Name, err))
		}
	})
	return errors.Join(errs...)
}
