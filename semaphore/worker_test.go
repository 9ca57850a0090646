package semaphore

const workerEnv = "SLUICE_SEMAPHORE_WORKER"

func runWorker(mode string) int { return 2 }
