package demo

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestDashboard(t *testing.T) {
	s := NewSeries([]string{"x"}, threeChapters(), time.Second, 0)
	s.Add(Reading{At: time.Second, Window: time.Second, Limits: []string{"api/</script><b>"},
		Counts: map[string]map[string]Count{"x": {"api/</script><b>": {Admitted: 3}}}})
	srv := httptest.NewServer(Dashboard(s))
	defer srv.Close()

	get := func(path string) (*http.Response, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	resp, page := get("/")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	if strings.Contains(page, string(dataMark)) || !strings.Contains(page, `"regions":["x"]`) {
		t.Error("the page does not carry the series")
	}
	if strings.Contains(page, "api/</script>") {
		t.Error("a limit name closes the page's script element: the JSON is not escaped")
	}
	for _, asset := range []string{"http://", "https://", "src="} {
		if strings.Contains(page, asset) {
			t.Errorf("the page refers to something outside (%q): everything must be inline", asset)
		}
	}

	resp, body := get("/api/series")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /api/series: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	var snap Snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Samples) != 1 || snap.Samples[0].Admitted["api/</script><b>"][0] != 3 {
		t.Errorf("series: %+v", snap)
	}
	if resp, _ := get("/nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nope: %s, want 404", resp.Status)
	}
	post, err := http.Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %s, want 405", post.Status)
	}
}
