package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const dashboardFile = "../../../../manifests/observability/diskfit-dashboard.json"

// dashboard is the part of Grafana's dashboard JSON model the checks read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
}

// minSchemaVersion is Grafana 10.3's; older Grafanas migrate the panels
// differently.
const minSchemaVersion = 39

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	return d
}

// The dashboard is one Grafana imports and provisions: an identity, a
// recent schema, its data source chosen through ${datasource}, and panels
// that each query something.
func TestDashboardIsAGrafanaDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed", d.UID, d.Title)
	}
	if d.SchemaVersion < minSchemaVersion {
		t.Errorf("schemaVersion %d, want at least %d", d.SchemaVersion, minSchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds := vars["datasource"]; ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
		t.Errorf("variable datasource: type %q, query %s; want a Prometheus data source variable", ds.Type, ds.Query)
	}
	for _, name := range []string{"node", "disk"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" {
			t.Errorf("variable %s: missing or not a query variable", name)
			continue
		}
		checkDatasource(t, "variable "+name, v.Datasource)
	}

	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d is used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v is outside Grafana's 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		checkDatasource(t, "panel "+p.Title, p.Datasource)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: target %q has no expression or a missing or repeated refId", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			checkDatasource(t, "panel "+p.Title+" target "+tg.RefID, tg.Datasource)
			queries++
		}
	}
	if queries == 0 {
		t.Error("the dashboard queries nothing")
	}
}

func checkDatasource(t *testing.T, where string, ds *datasource) {
	t.Helper()
	if ds == nil || ds.Type != "prometheus" || ds.UID != "${datasource}" {
		t.Errorf("%s: datasource %+v, want {prometheus ${datasource}}", where, ds)
	}
}

// Every metric and label the dashboard's expressions and variables name is
// a documented one, and every per-disk selector follows the node and disk
// variables.
func TestDashboardUsesDocumentedMetrics(t *testing.T) {
	d := readDashboard(t)
	type expression struct{ where, expr string }
	var exprs []expression
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, expression{"panel " + p.Title + " target " + tg.RefID, tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, q.Query)
			continue
		}
		exprs = append(exprs, expression{"variable " + v.Name, m[1] + " by (" + m[2] + ") "})
	}

	used := map[string]bool{}
	for _, e := range exprs {
		selectors, grouping, err := parseExpr(e.expr)
		if err != nil {
			t.Errorf("%s: %v", e.where, err)
			continue
		}
		var labels []string
		for _, s := range selectors {
			m, suffix := lookup(s.name)
			if m == nil {
				t.Errorf("%s: metric %s is not in metrics.Documented", e.where, s.name)
				continue
			}
			used[m.Name] = true
			own := m.Labels
			if suffix == "_bucket" {
				own = append(slices.Clone(own), "le")
			}
			labels = append(labels, own...)
			for _, l := range s.labels {
				if !slices.Contains(own, l) {
					t.Errorf("%s: %s has no label %s (it has %v)", e.where, s.name, l, own)
				}
			}
			if slices.Contains(m.Labels, "disk") && !(strings.Contains(s.matchers, `node=~"$node"`) && strings.Contains(s.matchers, `disk=~"$disk"`)) &&
				!strings.HasPrefix(e.where, "variable ") {
				t.Errorf("%s: %s{%s} does not follow the node and disk variables", e.where, s.name, s.matchers)
			}
		}
		for _, l := range grouping {
			if !slices.Contains(labels, l) {
				t.Errorf("%s: groups by %s, a label none of its metrics has", e.where, l)
			}
		}
	}
	if len(used) == 0 {
		t.Fatal("no documented metric found in the dashboard")
	}
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// lookup finds a documented metric by a series name, which for a
// histogram carries a suffix.
func lookup(series string) (*Metric, string) {
	for i := range Documented {
		m := &Documented[i]
		if series == m.Name {
			return m, ""
		}
		if m.Type != Histogram {
			continue
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if series == m.Name+suffix {
				return m, suffix
			}
		}
	}
	return nil, ""
}

// selector is one vector selector of an expression.
type selector struct {
	name string
	// matchers is what stands between the braces.
	matchers string
	labels   []string
}

var (
	// token splits PromQL into string literals, label matchers in
	// braces, range and subquery brackets, names, numbers and single
	// characters.
	token = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\}|\[[^\]]*\]|[a-zA-Z_:][a-zA-Z0-9_:]*|[0-9][0-9a-zA-Z_.]*|\S`)
	// matcherLabel is the label name of one matcher.
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	// groupingWords take a list of label names in parentheses.
	groupingWords = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
	// keywords are PromQL words that are not metrics: operators and the
	// aggregations, which may take their grouping before their argument.
	keywords = []string{"and", "or", "unless", "bool", "offset", "inf", "nan",
		"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
		"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)

// parseExpr finds the vector selectors of a PromQL expression and the
// labels it groups or matches by. It is a tokenizer, not a PromQL parser:
// enough to see every metric and label name an expression uses.
func parseExpr(expr string) ([]selector, []string, error) {
	toks := token.FindAllString(expr, -1)
	var sels []selector
	var groupBy []string
	for i := 0; i < len(toks); i++ {
		tok := toks[i]
		next := ""
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch {
		case strings.HasPrefix(tok, "{"):
			return nil, nil, fmt.Errorf("label matchers %s without a metric name", tok)
		case !isName(tok) || slices.Contains(keywords, tok):
		case slices.Contains(groupingWords, tok) && next == "(":
			i += 2
			for ; i < len(toks) && toks[i] != ")"; i++ {
				if isName(toks[i]) {
					groupBy = append(groupBy, toks[i])
				}
			}
		case next == "(":
			// A function or an aggregation.
		default:
			sel := selector{name: tok}
			if strings.HasPrefix(next, "{") {
				sel.matchers = strings.TrimSpace(next[1 : len(next)-1])
				for _, m := range matcherLabel.FindAllStringSubmatch(sel.matchers, -1) {
					sel.labels = append(sel.labels, m[1])
				}
				i++
			}
			sels = append(sels, sel)
		}
	}
	return sels, groupBy, nil
}

func isName(tok string) bool {
	c := tok[0]
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func TestParseExpr(t *testing.T) {
	tests := []struct {
		name          string
		expr          string
		wantSelectors []selector
		wantGrouping  []string
		wantErr       bool
	}{
		{
			name:          "aggregation with grouping first, range, matchers with braces in a value",
			expr:          `sum by (le, node) (rate(a_bucket{x="}", y=~"$v"}[$__rate_interval]))`,
			wantSelectors: []selector{{name: "a_bucket", matchers: `x="}", y=~"$v"`, labels: []string{"x", "y"}}},
			wantGrouping:  []string{"le", "node"},
		},
		{
			name:          "grouping last, offset, numbers, binary operators",
			expr:          `100 * (1 - sum(b) without (disk) / (c offset 1h > 0)) or vector(0)`,
			wantSelectors: []selector{{name: "b"}, {name: "c"}},
			wantGrouping:  []string{"disk"},
		},
		{
			name:          "one-to-many matching",
			expr:          `d * on (node) group_left (disk) e{f!="g"}`,
			wantSelectors: []selector{{name: "d"}, {name: "e", matchers: `f!="g"`, labels: []string{"f"}}},
			wantGrouping:  []string{"node", "disk"},
		},
		{
			name:          "strings are no metrics",
			expr:          `label_replace(h, "dst", "$1", "src", "(.*)")`,
			wantSelectors: []selector{{name: "h"}},
		},
		{
			name:    "matchers without a metric",
			expr:    `{__name__="x"}`,
			wantErr: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sels, grouping, err := parseExpr(tc.expr)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantSelectors, sels, cmp.AllowUnexported(selector{})); diff != "" {
				t.Errorf("selectors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantGrouping, grouping); diff != "" {
				t.Errorf("grouping (-want +got):\n%s", diff)
			}
		})
	}
}
