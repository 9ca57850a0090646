--lib
local now = now_us()
return 1
