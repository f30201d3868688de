package glob

import "testing"

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"":              "",
		"lock:":         "lock:",
		`a*b?c[d]e\f`:   `a\*b\?c\[d\]e\\f`,
		"svc[1]:":       `svc\[1\]:`,
		"ünïcode{tag}:": "ünïcode{tag}:",
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}
