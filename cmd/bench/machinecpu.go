package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MachineCPU is how the machine's CPUs spent a run, from /proc/stat's
// "cpu" line before and after it (Linux only): busy is user, nice,
// system, irq and softirq time; stolen is time the hypervisor gave this
// VM's virtual CPUs to others. A run during which much was stolen or the
// CPUs were near full measured the machine as much as the bucket:
// lateness tails and Redis time per call grow with both.
type MachineCPU struct {
	Busy   float64 `json:"busy_fraction"`
	Stolen float64 `json:"stolen_fraction"`
}

// cpuTimes are /proc/stat's aggregate cpu counters (in ticks).
type cpuTimes struct{ busy, steal, total uint64 }

// readCPUTimes reads /proc/stat; ok is false where there is none.
func readCPUTimes() (cpuTimes, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if t, ok := parseCPULine(sc.Text()); ok {
			return t, true
		}
	}
	return cpuTimes{}, false
}

// parseCPULine reads "cpu  user nice system idle iowait irq softirq steal ...".
func parseCPULine(line string) (cpuTimes, bool) {
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuTimes{}, false
	}
	var v [8]uint64
	for i := range v {
		n, err := strconv.ParseUint(fields[i+1], 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		v[i] = n
	}
	user, nice, system, idle, iowait, irq, softirq, steal := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
	busy := user + nice + system + irq + softirq
	return cpuTimes{busy: busy, steal: steal, total: busy + idle + iowait + steal}, true
}

// machineCPU is the share of the interval between a and b.
func machineCPU(a, b cpuTimes) *MachineCPU {
	total := b.total - a.total
	if b.total <= a.total {
		return nil
	}
	return &MachineCPU{Busy: float64(b.busy-a.busy) / float64(total), Stolen: float64(b.steal-a.steal) / float64(total)}
}

func (m *MachineCPU) String() string {
	return fmt.Sprintf("%.0f %% busy, %.1f %% stolen", 100*m.Busy, 100*m.Stolen)
}
