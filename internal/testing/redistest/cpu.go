package redistest

import (
	"fmt"
	"strconv"
	"strings"
)

// ServerCPU is the CPU a Redis server has used, in seconds: used_cpu_sys +
// used_cpu_user of INFO's "cpu" section, found in info (the whole INFO
// text, or any sections that include "cpu"). It fails when either is
// missing or not a number.
func ServerCPU(info string) (float64, error) {
	var cpu float64
	seen := 0
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k != "used_cpu_sys" && k != "used_cpu_user" {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
		}
		cpu += x
		seen++
	}
	if seen != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_sys or used_cpu_user missing")
	}
	return cpu, nil
}
