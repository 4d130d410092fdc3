-- Argo CD health check for elastream.dev/StreamTopology (resource.customizations.health.elastream.dev_StreamTopology).
-- It reads what the operator writes (docs/operations.md, "Health for GitOps tools"):
--   status.observedGeneration behind metadata.generation -> Progressing (the operator has not seen the spec yet)
--   Stalled=True (a change by the user is needed)          -> Degraded
--   Degraded=True (workers lost, Redis away past 60 s ...)  -> Degraded
--   Ready=True (Available, not Progressing, not Degraded)   -> Healthy
--   Ready=True, reason Suspended (spec.suspend: true)       -> Suspended (Argo CD's own health status for it)
--   anything else (Reconciling=True, no status yet)         -> Progressing
-- Lua 5.1 as Argo CD runs it (gopher-lua): no goto, no integer division, no bit operators.
local hs = {}

local function find(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local function said(condition, fallback)
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    if condition.reason ~= nil and condition.reason ~= "" then
      return condition.reason .. ": " .. condition.message
    end
    return condition.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the elastream operator to report a status"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to apply generation " .. tostring(generation) ..
    " (observed " .. tostring(status.observedGeneration) .. ")"
  return hs
end

local conditions = status.conditions
local stalled = find(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = said(stalled, "Stalled: the topology needs a change of its spec")
  return hs
end

local degraded = find(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = said(degraded, "Degraded")
  return hs
end

local ready = find(conditions, "Ready")
if ready ~= nil and ready.reason == "Suspended" then
  hs.status = "Suspended"
  hs.message = said(ready, "Suspended by spec.suspend")
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = said(ready, "Running as specified")
  return hs
end

local reconciling = find(conditions, "Reconciling")
hs.status = "Progressing"
hs.message = said(reconciling, said(ready, "Waiting for the topology to become ready"))
return hs
