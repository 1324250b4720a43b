package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// limitsValidate checks files offline and prints every problem, one a
// line: FILE:LINE: FIELD: MSG.
func (c *cli) limitsValidate(_ context.Context, args []string) error {
	fs := c.flags("limits validate", "FILE...")
	files, err := c.parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	type problem struct {
		File    string `json:"file"`
		Line    int    `json:"line,omitempty"`
		Field   string `json:"field,omitempty"`
		Message string `json:"message"`
		text    string
	}
	type fileResult struct {
		File   string    `json:"file"`
		OK     bool      `json:"ok"`
		Errors []problem `json:"errors,omitempty"`
	}
	var results []fileResult
	bad := 0
	for _, f := range files {
		r := fileResult{File: f}
		var ces allot.ConfigErrors
		switch _, err := allot.LoadConfigFile(f); {
		case errors.As(err, &ces):
			for _, e := range ces {
				r.Errors = append(r.Errors, problem{File: e.File, Line: e.Line, Field: e.Field, Message: e.Msg, text: e.Error()})
			}
		case err != nil:
			r.Errors = []problem{{File: f, Message: err.Error(), text: err.Error()}}
		}
		r.OK = len(r.Errors) == 0
		if !r.OK {
			bad++
		}
		results = append(results, r)
	}
	if c.output == "json" {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
	} else {
		for _, r := range results {
			if r.OK {
				fmt.Fprintf(c.stdout, "%s: ok\n", r.File)
			}
			for _, e := range r.Errors {
				fmt.Fprintln(c.stdout, e.text)
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d file(s) invalid", bad, len(files))
	}
	return nil
}

// readFile reads a limits file and checks it before sending it, so that
// its problems are reported with the file's own name.
func readFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := allot.ParseConfig(path, data); err != nil {
		return nil, err
	}
	return data, nil
}

func (c *cli) limitsDiff(ctx context.Context, args []string) error {
	return c.applyFile(ctx, "limits diff", args, true)
}

func (c *cli) limitsApply(ctx context.Context, args []string) error {
	return c.applyFile(ctx, "limits apply", args, false)
}

func (c *cli) applyFile(ctx context.Context, name string, args []string, dryRun bool) error {
	fs := c.flags(name, "FILE")
	summary := fs.String("summary", "", "what the change is for, in the history (default: the changes)")
	expect := fs.Int64("expect-version", -1, "refuse unless this is the current version (for scripts)")
	pos, err := c.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	data, err := readFile(pos[0])
	if err != nil {
		return err
	}
	req := &allotv1.ApplyConfigRequest{Yaml: string(data), File: pos[0], DryRun: dryRun, Author: c.author, Summary: *summary}
	if *expect >= 0 {
		req.ExpectVersion = expect
	}
	var resp *allotv1.ApplyConfigResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.ApplyConfig(ctx, req)
		return err
	}); err != nil {
		return err
	}
	return c.printApply(resp, dryRun)
}

func (c *cli) limitsHistory(ctx context.Context, args []string) error {
	fs := c.flags("limits history", "")
	n := fs.Int("limit", 20, "how many versions")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	var resp *allotv1.HistoryResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.History(ctx, &allotv1.HistoryRequest{Limit: int32(*n)})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(resp)
	}
	if len(resp.GetVersions()) == 0 {
		fmt.Fprintln(c.stdout, "no configuration stored yet")
		return nil
	}
	var rows [][]string
	for i, v := range resp.GetVersions() {
		ver := strconv.FormatInt(v.GetVersion(), 10)
		if i == 0 {
			ver += " (current)"
		}
		rows = append(rows, []string{ver, v.GetTime().AsTime().UTC().Format(time.RFC3339), orDash(v.GetAuthor()), v.GetSummary()})
	}
	return table(c.stdout, []string{"VERSION", "TIME", "AUTHOR", "SUMMARY"}, rows)
}

func (c *cli) limitsShow(ctx context.Context, args []string) error {
	fs := c.flags("limits show", "[VERSION]")
	pos, err := c.parse(fs, args, 0, 1)
	if err != nil {
		return err
	}
	version, err := versionArg(pos)
	if err != nil {
		return err
	}
	var v *allotv1.ConfigVersion
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		v, err = a.GetConfig(ctx, &allotv1.GetConfigRequest{Version: version})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(v)
	}
	_, err = fmt.Fprint(c.stdout, v.GetYaml())
	return err
}

func versionArg(pos []string) (int64, error) {
	if len(pos) == 0 {
		return 0, nil
	}
	v, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("version %q: want a positive number", pos[0])
	}
	return v, nil
}

func (c *cli) limitsRollback(ctx context.Context, args []string) error {
	fs := c.flags("limits rollback", "[VERSION]")
	dryRun := fs.Bool("dry-run", false, "show the changes without applying them")
	pos, err := c.parse(fs, args, 0, 1)
	if err != nil {
		return err
	}
	version, err := versionArg(pos)
	if err != nil {
		return err
	}
	var resp *allotv1.ApplyConfigResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.Rollback(ctx, &allotv1.RollbackRequest{Version: version, Author: c.author, DryRun: *dryRun})
		return err
	}); err != nil {
		return err
	}
	return c.printApply(resp, *dryRun)
}

func (c *cli) limitsShadow(ctx context.Context, args []string) error {
	return c.updateLimit(ctx, "limits shadow", "LIMIT on|off", args, func(v string, req *allotv1.UpdateLimitRequest) error {
		switch v {
		case "on", "true":
			req.Shadow = new(true)
		case "off", "false":
			req.Shadow = new(false)
		default:
			return fmt.Errorf("limits shadow: %q: want on or off", v)
		}
		return nil
	})
}

func (c *cli) limitsMode(ctx context.Context, args []string) error {
	return c.updateLimit(ctx, "limits mode", "LIMIT split|shared", args, func(v string, req *allotv1.UpdateLimitRequest) error {
		if v != "split" && v != "shared" {
			return fmt.Errorf("limits mode: %q: want split or shared", v)
		}
		req.Mode = &v
		return nil
	})
}

func (c *cli) updateLimit(ctx context.Context, name, synopsis string, args []string, set func(string, *allotv1.UpdateLimitRequest) error) error {
	fs := c.flags(name, synopsis)
	domain := fs.String("domain", "", "the limit's domain (needed when several domains have a limit of that name)")
	pos, err := c.parse(fs, args, 2, 2)
	if err != nil {
		return err
	}
	req := &allotv1.UpdateLimitRequest{Domain: *domain, Limit: pos[0], Author: c.author}
	if err := set(pos[1], req); err != nil {
		return err
	}
	var resp *allotv1.ApplyConfigResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.UpdateLimit(ctx, req)
		return err
	}); err != nil {
		return err
	}
	return c.printApply(resp, false)
}
