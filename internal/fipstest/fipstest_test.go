package fipstest

import (
	"slices"
	"testing"
)

func TestEnv(t *testing.T) {
	for _, tc := range []struct {
		env, want []string
	}{
		{[]string{"HOME=/h"}, []string{"HOME=/h", "GODEBUG=fips140=only"}},
		{[]string{"GODEBUG=", "HOME=/h"}, []string{"HOME=/h", "GODEBUG=fips140=only"}},
		{[]string{"GODEBUG=http2client=0,fips140=on", "HOME=/h"}, []string{"HOME=/h", "GODEBUG=http2client=0,fips140=on,fips140=only"}},
	} {
		if got := Env(tc.env); !slices.Equal(got, tc.want) {
			t.Errorf("Env(%q) = %q, want %q", tc.env, got, tc.want)
		}
	}
}
