package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"
)

// checkOutputFormat accepts the -o values every command takes: json, yaml
// or none (a table).
func checkOutputFormat(format string) error {
	switch format {
	case "", "json", "yaml":
		return nil
	}
	return fmt.Errorf("unknown output format %q: use json or yaml", format)
}

// printEncoded writes report as indented JSON or as YAML.
func printEncoded(out io.Writer, format string, report any) error {
	var raw []byte
	var err error
	if format == "json" {
		raw, err = json.MarshalIndent(report, "", "  ")
		raw = append(raw, '\n')
	} else {
		raw, err = yaml.Marshal(report)
	}
	if err != nil {
		return fmt.Errorf("encoding %s: %w", format, err)
	}
	_, err = out.Write(raw)
	return err
}
